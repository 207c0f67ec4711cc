package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/testhook"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/kstate"
)

// restores is a slog.Handler that keeps, per task, the changelog records
// each "task restored" said it read, and the other messages about a task.
type restores struct {
	mu    *sync.Mutex
	reads map[string][]int64
	said  map[string][]string
}

func (r restores) Enabled(context.Context, slog.Level) bool { return true }
func (r restores) Handle(_ context.Context, rec slog.Record) error {
	var task string
	var n int64 = -1
	rec.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "task":
			task = a.Value.String()
		case "records":
			n = a.Value.Int64()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.Message == "task restored" {
		r.reads[task] = append(r.reads[task], n)
	}
	if task != "" {
		r.said[task] = append(r.said[task], rec.Message)
	}
	return nil
}
func (r restores) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r restores) WithGroup(string) slog.Handler      { return r }

func (r restores) saidOf(task string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.said[task])
}

func (r restores) of(task string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reads[task])
}

// Three instances of the aggregate job. With a standby replica each,
// every task runs on one instance and stands by on another. When one
// crashes, the group's leader gives each of its tasks to the instance
// holding its standby, whose restore reads nothing: the copy had applied
// everything. Without standbys, the same restores read the tasks' whole
// changelog partitions. Either way the outputs stay exactly once across
// the failover, and the input written after it counts on from the state
// the tasks took over.
func TestStandbyReplicasTakeOverFromTheirCopies(t *testing.T) {
	for _, replicas := range []int{1, 0} {
		t.Run(fmt.Sprintf("standbys=%d", replicas), func(t *testing.T) { testStandbyFailover(t, replicas) })
	}
}

func testStandbyFailover(t *testing.T, replicas int) {
	const partitions, instances, keys, first, second = 6, 3, 300, 6000, 2000
	const app = "sb"
	sc := newStandbyCluster(t, partitions, keys)
	c, brokers, adm := sc.c, sc.brokers, sc.adm
	if err := sc.produce(first); err != nil {
		t.Fatal(err)
	}
	// The first three listings of a changelog partition's offsets on
	// their own (a standby's rounds) fail with an error to retry: the
	// standby tries the round again, its file kept open.
	var injected atomic.Int32
	c.ControlKey(int16(kmsg.ListOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic != changelog.TopicName(app) || len(req.Topics[0].Partitions) != 1 || injected.Add(1) > 3 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = req.Topics[0].Topic
		rp := kmsg.NewListOffsetsResponseTopicPartition()
		rp.Partition, rp.ErrorCode = req.Topics[0].Partitions[0].Partition, kerr.OffsetNotAvailable.Code
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	members := make([]*standbyInstance, instances)
	start := func(i int) {
		members[i] = startStandbyInstance(t, ctx, cancel, brokers, app, i, func(o *sluice.Options) { o.StandbyReplicas = replicas })
	}
	metric := func(reg *prometheus.Registry, name string, labels ...string) float64 {
		return metricOf(t, reg, name, labels...)
	}
	running := func(m *standbyInstance) float64 { return metric(m.reg, "sluice_tasks", "state", "running") }
	standing := func(m *standbyInstance) float64 { return metric(m.reg, "sluice_tasks", "state", "standby") }

	// The first alone: the tasks the others take from it restore there
	// from scratch, and those it keeps were never elsewhere.
	start(0)
	waitUntil(t, "the first instance running every task", func() bool { return running(members[0]) == partitions })
	for i := 1; i < instances; i++ {
		start(i)
	}
	consumed := consumedAll(adm, app, first)
	cl := changelog.TopicName(app)
	var moved []string         // the first instance's tasks
	holder := map[string]int{} // which instance stands by for each
	waitUntil(t, "the input consumed, two tasks running and standing by on each instance, the standbys up to date", func() bool {
		if !consumed(nil) {
			return false
		}
		for _, m := range members {
			if running(m) != 2 || standing(m) != float64(2*replicas) {
				return false
			}
		}
		moved = labelValues(t, members[0].reg, "sluice_epoch", "task")
		if replicas == 0 {
			return true
		}
		ends, err := adm.ListEndOffsets(context.Background(), cl)
		if err != nil {
			return false
		}
		for _, label := range moved {
			p, _ := strconv.Atoi(label)
			end, ok := ends.Lookup(cl, int32(p))
			holder[label] = -1
			for i, m := range members {
				// Past the last marker, the commit's control record.
				if slices.Contains(labelValues(t, m.reg, "sluice_standby_changelog_offset", "task"), label) &&
					ok && metric(m.reg, "sluice_standby_changelog_offset", "task", label) == float64(end.Offset-1) {
					holder[label] = i
				}
			}
			if holder[label] < 1 {
				return false
			}
		}
		return true
	})
	if len(moved) != 2 {
		t.Fatalf("the first instance runs tasks %v, want 2", moved)
	}
	// A stale query of a key of the first instance's tasks on the
	// instance keeping its standby reads what the first instance reads.
	job := jobs.Aggregate()
	read := func(v *any) func(kstate.Scope) error {
		return func(s kstate.Scope) error {
			got, _, err := job.QueryState(s, job.States[0])
			*v = got
			return err
		}
	}
	for _, label := range moved {
		p, _ := strconv.Atoi(label)
		key := ""
		for k := range keys {
			if members[0].inst.PartitionOf([]byte(sc.key(k))) == int32(p) {
				key = sc.key(k)
				break
			}
		}
		var want, got any
		if err := members[0].inst.Query([]byte(key), read(&want)); err != nil || want == nil {
			t.Fatalf("%s on its owner: %v, %v", key, want, err)
		}
		for i, m := range members[1:] {
			standby, err := m.inst.QueryStale([]byte(key), read(&got))
			switch {
			case replicas > 0 && i+1 == holder[label] && (err != nil || !standby || fmt.Sprint(got) != fmt.Sprint(want)):
				t.Errorf("%s, stale, on the instance keeping its standby: %v (standby %v, %v), want %v", key, got, standby, err, want)
			case (replicas == 0 || i+1 != holder[label]) && !errors.Is(err, sluice.ErrNotLocal):
				t.Errorf("%s, stale, on an instance without its task or standby: %v, want ErrNotLocal", key, err)
			}
			if replicas > 0 && i+1 == holder[label] {
				// The holder's standby is caught up: its lag is
				// the commit's control record, or none.
				waitUntil(t, "task "+label+"'s standby lag known and at most 1", func() bool {
					lag, ok := m.inst.StandbyLag(int32(p))
					return ok && lag >= 0 && lag <= 1
				})
			}
		}
	}

	sizes := changelogSizes(t, brokers, app)
	for _, label := range moved {
		for _, m := range members[1:] {
			if reads := m.log.of(label); len(reads) > 0 {
				t.Fatalf("task %s, which the first instance ran from the start, restored elsewhere before the crash: %v", label, reads)
			}
		}
	}

	testhook.Kill(members[0].inst)
	if err := <-members[0].done; err != nil {
		t.Fatal(err)
	}
	members[0].done <- nil
	// The others take its tasks once its session times out.
	waitUntil(t, "the others running every task", func() bool {
		return running(members[1]) == partitions/2 && running(members[2]) == partitions/2
	})
	for _, label := range moved {
		var got []int
		var reads []int64
		for i, m := range members[1:] {
			if r := m.log.of(label); len(r) > 0 {
				got, reads = append(got, i+1), append(reads, r...)
			}
		}
		if len(reads) != 1 {
			t.Fatalf("task %s restored %d times after the crash (instances %v), want once", label, len(reads), got)
		}
		said := members[got[0]].log.saidOf(label)
		if slices.Contains(said, "restore failed; retrying") {
			t.Errorf("task %s's restore failed on instance %d: %q", label, got[0], said)
		}
		switch read := reads[0]; {
		case replicas > 0 && !(slices.Contains(said, "standby replica stopped") && slices.Index(said, "standby replica stopped") < slices.Index(said, "task restored")):
			t.Errorf("task %s's standby on instance %d did not stop before its restore: %q", label, got[0], said)
		case replicas > 0 && got[0] != holder[label]:
			t.Errorf("task %s went to instance %d, not to %d, which held its standby", label, got[0], holder[label])
		case replicas > 0 && read != 0:
			t.Errorf("task %s read %d changelog records to run on instance %d, want 0: its standby there had applied them all", label, read, got[0])
		case replicas == 0 && read != sizes[label]:
			t.Errorf("task %s read %d changelog records to run without a standby, want its partition's %d", label, read, sizes[label])
		}
	}

	if replicas > 0 {
		var retried bool
		for _, m := range members {
			for p := range partitions {
				said := m.log.saidOf(strconv.Itoa(p))
				retried = retried || slices.Contains(said, "standby replica's round failed; trying again")
				if slices.Contains(said, "standby replica failed; retrying") {
					t.Errorf("task %d's standby failed and reopened its file: %q", p, said)
				}
			}
		}
		if injected.Load() < 3 || !retried {
			t.Errorf("%d listings failed, and no standby tried its round again", min(injected.Load(), 3))
		}
	}

	// The input after the failover counts on from the state taken over.
	sc.checkAfter(t, app, second, "the failover")
}

// standbyCluster is the broker of the standby tests, with topics "in" and
// "out", a client producing the aggregate job's input to it, and the
// inputs written so far, by key.
type standbyCluster struct {
	c       *kfake.Cluster
	brokers []string
	pcl     *kgo.Client
	adm     *kadm.Client
	keys    int
	inputs  map[string][]int64
	sent    int
}

func newStandbyCluster(t *testing.T, partitions int32, keys int) *standbyCluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	pcl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pcl.Close)
	return &standbyCluster{c: c, brokers: c.ListenAddrs(), pcl: pcl, adm: kadm.NewClient(pcl), keys: keys, inputs: map[string][]int64{}}
}

// key is the i-th key.
func (sc *standbyCluster) key(i int) string { return fmt.Sprintf("k%04d", i) }

// produce writes the next n inputs: input i has key i%keys and value i%7.
// One goroutine at a time.
func (sc *standbyCluster) produce(n int) error {
	var recs []*kgo.Record
	for i := sc.sent; i < sc.sent+n; i++ {
		k, v := sc.key(i%sc.keys), int64(i%7)
		sc.inputs[k] = append(sc.inputs[k], v)
		recs = append(recs, &kgo.Record{Key: []byte(k), Value: []byte(strconv.FormatInt(v, 10))})
	}
	sc.sent += n
	return sc.pcl.ProduceSync(context.Background(), recs...).FirstErr()
}

// checkAfter writes n more inputs, waits until app consumed them all, and
// checks its outputs exactly once: what the tasks count on from the state
// they took over after what.
func (sc *standbyCluster) checkAfter(t *testing.T, app string, n int, what string) {
	t.Helper()
	if err := sc.produce(n); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the input after "+what+" consumed", func() bool { return consumedAll(sc.adm, app, int64(sc.sent))(nil) })
	outs, err := check.ReadToEnd(context.Background(), sc.brokers, "out", kgo.ReadCommitted())
	if err != nil {
		t.Fatal(err)
	}
	if r := check.Aggregate(sc.inputs, outs); !r.OK() {
		t.Fatalf("outputs after %s: %s", what, r)
	}
}

// changelogSizes counts the committed records of each partition of app's
// changelog, by task label.
func changelogSizes(t *testing.T, brokers []string, app string) map[string]int64 {
	t.Helper()
	records, err := check.ReadToEnd(context.Background(), brokers, changelog.TopicName(app), kgo.ReadCommitted())
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	for _, r := range records {
		sizes[strconv.Itoa(int(r.Partition))]++
	}
	return sizes
}

// standbyInstance is an instance of the standby tests: its registry, what
// it logged of its tasks, and the end of its Run.
type standbyInstance struct {
	inst *sluice.Instance
	reg  *prometheus.Registry
	log  restores
	done chan error
}

// startStandbyInstance runs instance i of app (the aggregate job, into
// "out", its options as adjust sets them) until ctx ends; the test's
// cleanup cancels it and wants Run to end without an error.
func startStandbyInstance(t *testing.T, ctx context.Context, cancel context.CancelFunc, brokers []string, app string, i int, adjust func(*sluice.Options)) *standbyInstance {
	t.Helper()
	opts := testOptions(brokers, app, jobs.Aggregate(), filepath.Join(t.TempDir(), strconv.Itoa(i)))
	opts.OutputTopic, opts.InstanceID = "out", "i"+strconv.Itoa(i)
	adjust(&opts)
	m := &standbyInstance{reg: prometheus.NewRegistry(), log: restores{mu: &sync.Mutex{}, reads: map[string][]int64{}, said: map[string][]string{}}, done: make(chan error, 1)}
	opts.Registry, opts.Logger = m.reg, slog.New(m.log)
	inst, err := sluice.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	m.inst = inst
	go func() { m.done <- inst.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-m.done; err != nil {
			t.Error(err)
		}
		m.done <- nil // for the next Cleanup of this member, if any
	})
	return m
}

// labelValues lists the values of label on the series of name in reg.
func labelValues(t *testing.T, reg prometheus.Gatherer, name, label string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	return out
}

// An instance joining a group whose tasks hold more changelog than
// AcceptableRecoveryLag gets none of them at first: the tasks its share
// would take keep running where they are while it builds their copies,
// warm-ups. Once a copy has caught up, the instance asks the group to
// rebalance and the task moves, its restore reading only the tail written
// since (nothing when no input arrives meanwhile). With warm-ups off the
// same join restores the tasks from their whole changelog. Input arrives
// throughout the join in the busy variants, which write more changelog
// during a move than the acceptable lag (a task must not bounce back to
// its old instance, found by review). Either way the outputs stay exactly
// once.
func TestWarmupReplicasMoveTasksOnceCaughtUp(t *testing.T) {
	for _, warmups := range []int{2, -1} {
		for _, busy := range []bool{false, true} {
			t.Run(fmt.Sprintf("warmups=%d/busy=%v", warmups, busy), func(t *testing.T) { testWarmups(t, warmups, busy) })
		}
	}
}

func testWarmups(t *testing.T, warmups int, busy bool) {
	const partitions, keys, first, second, lag = 4, 2000, 8000, 2000, 50
	const app = "wu"
	sc := newStandbyCluster(t, partitions, keys)
	brokers, adm := sc.brokers, sc.adm
	if err := sc.produce(first); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	adjust := func(o *sluice.Options) {
		o.StandbyReplicas, o.MaxWarmupReplicas, o.AcceptableRecoveryLag = 1, warmups, lag
	}
	running := func(m *standbyInstance) float64 { return metricOf(t, m.reg, "sluice_tasks", "state", "running") }
	first0 := startStandbyInstance(t, ctx, cancel, brokers, app, 0, adjust)
	waitUntil(t, "the first instance running every task, the input consumed", func() bool {
		return running(first0) == partitions && consumedAll(adm, app, first)(nil)
	})
	sizes := changelogSizes(t, brokers, app)
	for p, n := range sizes {
		if n <= lag {
			t.Fatalf("changelog partition %s holds %d records, not above the acceptable lag %d", p, n, lag)
		}
	}

	// Busy: input keeps arriving until the tasks have moved, some 10,000
	// records a second (a load, paced; nothing waits on it).
	stop := make(chan struct{})
	loaded := make(chan error, 1)
	go func() {
		for busy {
			select {
			case <-stop:
				loaded <- nil
				return
			case <-time.After(20 * time.Millisecond):
			}
			if err := sc.produce(200); err != nil {
				loaded <- err
				return
			}
		}
		loaded <- nil
	}()
	joining := startStandbyInstance(t, ctx, cancel, brokers, app, 1, adjust)
	waitUntil(t, "two tasks running on each instance", func() bool { return running(first0) == 2 && running(joining) == 2 })
	close(stop)
	if err := <-loaded; err != nil {
		t.Fatal(err)
	}
	moved := labelValues(t, joining.reg, "sluice_epoch", "task")
	if len(moved) != 2 {
		t.Fatalf("the joining instance runs tasks %v, want 2", moved)
	}
	asks := metricOf(t, joining.reg, "sluice_warmup_rebalances_total")
	for _, label := range moved {
		reads := joining.log.of(label)
		said := joining.log.saidOf(label)
		switch {
		case len(reads) != 1:
			t.Errorf("task %s restored %d times on the joining instance, want once: %q", label, len(reads), said)
		case warmups > 0 && !busy && reads[0] != 0:
			t.Errorf("task %s read %d changelog records to run on the joining instance, want 0: its warm-up there had caught up (%q)", label, reads[0], said)
		case warmups > 0 && reads[0] >= sizes[label]:
			t.Errorf("task %s read %d changelog records to run on the joining instance, as many as its partition held before the join (%d): its warm-up had caught up (%q)", label, reads[0], sizes[label], said)
		case warmups > 0 && !(slices.Contains(said, "standby replica stopped") && slices.Index(said, "standby replica stopped") < slices.Index(said, "task restored")):
			t.Errorf("task %s's warm-up did not stop before its restore: %q", label, said)
		case warmups < 0 && reads[0] < sizes[label]:
			t.Errorf("task %s read %d changelog records without warm-ups, want at least its partition's %d before the join", label, reads[0], sizes[label])
		}
	}
	switch {
	case warmups > 0 && (asks < 1 || asks > 4):
		t.Errorf("the joining instance asked for %v rebalances, want one or two, one for each warm-up at most: its warm-ups caught up", asks)
	case warmups < 0 && asks != 0:
		t.Errorf("the joining instance asked for %v rebalances without warm-ups", asks)
	}

	// The input after the move counts on from the state moved.
	sc.checkAfter(t, app, second, "the move")
}
