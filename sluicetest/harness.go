package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/testhook"
	"github.com/sluicehq/sluice/kstate"
)

// Names the harness gives its cluster's topics and its instance. Side
// outputs go to topics named after their tags.
const (
	// AppID is the instance's app id: its consumer group and the prefix
	// of its transactional id and internal topics.
	AppID = "sluicetest"
	// InputTopic is the topic Send produces to and the job reads, unless
	// Options.InputTopics names others.
	InputTopic = "input"
	// OutputTopic is the job's output topic (Context.Emit).
	OutputTopic = "output"
	// DeadLetterTopic is the job's dead-letter topic.
	DeadLetterTopic = AppID + "-dlq"
)

// instanceID is the same for every instance a harness starts, so that a
// restart is the same member of the group and fences its predecessor's
// transaction, as a restarted container with a stable SLUICE_INSTANCE_ID is.
const instanceID = "sluicetest-1"

// defaultStart is where the processing-time clock starts unless
// Options.Start says otherwise.
var defaultStart = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// Options configure a Harness. The zero value is ready to use.
type Options struct {
	// Partitions is the partition count of every topic: the inputs (so
	// the number of tasks), the output, the side outputs, the dead letters
	// and Topics. Default 1.
	Partitions int32
	// Start is the processing-time clock's first reading (Context.Now).
	// Default 2026-01-01T00:00:00Z.
	Start time.Time
	// Guarantee is the instance's delivery guarantee. Default
	// sluice.ExactlyOnce.
	Guarantee sluice.Guarantee
	// MaxOutOfOrderness is how far an EventTime job's watermark stays
	// behind the largest timestamp seen. Default 0.
	MaxOutOfOrderness time.Duration
	// Backend is the state backend: "bbolt" (the default), whose files
	// live in a temporary directory that survives Kill and Restart as a
	// container's volume would, or "memory", which a restart rebuilds
	// from the changelog.
	Backend string
	// Topics are more topics to create, for a job that writes to topics
	// of its own with Context.EmitTo; Records reads them.
	Topics []string
	// InputTopics are the topics the job reads, for a job that reads
	// several co-partitioned topics (co-processing: Record.Topic says
	// which). SendTo produces to any of them, Send to the first. Default
	// [InputTopic].
	InputTopics []string
	// Timeout bounds each wait of the harness: an instance starting or
	// stopping, Settle, a read of a topic. Default 30s.
	Timeout time.Duration
	// Logger receives the instances' logs. Default: discarded.
	Logger *slog.Logger
	// Configure, if set, adjusts the options of each instance the harness
	// starts, for what Options does not cover (IdleTimeout, epoch
	// budgets, TTL sweeps, a Hook). It runs last but cannot change what
	// the harness depends on: the brokers, app and instance ids, topics,
	// state directory, Clock and Registry are set again after it.
	Configure func(*sluice.Options)
}

// Harness runs one job against an in-process Kafka cluster (kfake) for the
// duration of a test: one instance at a time, driven by a processing-time
// clock that moves only when the test advances it. Its methods must be
// called from the test's goroutine; they report failures with t.Fatalf.
type Harness struct {
	t       TB
	job     sluice.Job
	opts    Options
	brokers []string
	clock   *clock
	dir     string // state directory, shared by every instance
	cl      *kgo.Client
	adm     *kadm.Client
	cur     *instance // nil while none runs (after Kill)
}

// instance is one run of the job: a sluice instance and the goroutine
// running it.
type instance struct {
	in   *sluice.Instance
	reg  *prometheus.Registry
	stop context.CancelFunc
	// alive is cancelled when Run returns, so that waits on the
	// instance end with it.
	alive context.Context
	done  chan struct{}
	err   error // what Run returned; read after done is closed
}

// New starts a cluster with the topics the job needs, starts an instance
// of job on it, and returns once the instance owns every input partition.
// Everything is stopped and removed when the test ends (t.Cleanup): the
// instance stops gracefully and must return no error.
func New(t TB, job sluice.Job, opts Options) *Harness {
	t.Helper()
	if opts.Partitions <= 0 {
		opts.Partitions = 1
	}
	if opts.Start.IsZero() {
		opts.Start = defaultStart
	}
	if opts.Guarantee == "" {
		opts.Guarantee = sluice.ExactlyOnce
	}
	if opts.Backend == "" {
		opts.Backend = "bbolt"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := job.Validate(); err != nil {
		t.Fatalf("sluicetest: %v", err)
	}
	if len(opts.InputTopics) == 0 {
		opts.InputTopics = []string{InputTopic}
	}
	opts.InputTopics = slices.Clone(opts.InputTopics)
	topics := append(slices.Clone(opts.InputTopics), OutputTopic, DeadLetterTopic)
	for _, tag := range job.SideOutputs {
		topics = append(topics, string(tag))
	}
	topics = append(topics, opts.Topics...)
	seen := map[string]bool{}
	for _, name := range topics {
		if err := validTopic(name); err != nil {
			t.Fatalf("sluicetest: %v", err)
		}
		if seen[name] {
			t.Fatalf("sluicetest: topic %q is named twice (the inputs, %s, %s, a side output's tag, Options.Topics)", name, OutputTopic, DeadLetterTopic)
		}
		seen[name] = true
	}

	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(opts.Partitions, topics...),
		// For a Configure that picks the consumer group protocol
		// (KIP-848): kfake's 5s default heartbeat interval leaves a
		// member with the harness's 6s session 1s of slack.
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "2000"}),
	)
	if err != nil {
		t.Fatalf("sluicetest: start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	dir, err := os.MkdirTemp("", "sluicetest-")
	if err != nil {
		t.Fatalf("sluicetest: state dir: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &Harness{
		t:       t,
		job:     job,
		opts:    opts,
		brokers: c.ListenAddrs(),
		clock:   &clock{now: opts.Start},
		dir:     dir,
	}
	h.cl, err = kgo.NewClient(
		kgo.SeedBrokers(h.brokers...),
		kgo.DefaultProduceTopic(opts.InputTopics[0]),
		kgo.ProducerLinger(0),
		// Kafka's default partitioner (murmur2 of the key), as the
		// engine's outputs and most producers use.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)
	if err != nil {
		t.Fatalf("sluicetest: client: %v", err)
	}
	t.Cleanup(h.cl.Close)
	h.adm = kadm.NewClient(h.cl)
	// Registered last, so it runs first: the instance stops while the
	// cluster is still there.
	t.Cleanup(h.cleanup)
	h.start()
	return h
}

// validTopic checks a topic name by Kafka's rules, so that a side-output
// tag that cannot name a topic fails here rather than at the broker.
func validTopic(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 249 {
		return fmt.Errorf("%q cannot name a topic", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q cannot name a topic: only ASCII letters, digits, '.', '_' and '-' can", name)
		}
	}
	return nil
}

// options are the options of each instance: short epochs, so that tests
// wait little, and the timeouts that keep a kfake group moving (DESIGN §10).
func (h *Harness) options(reg *prometheus.Registry) sluice.Options {
	side := map[sluice.OutputTag]string{}
	for _, tag := range h.job.SideOutputs {
		side[tag] = string(tag)
	}
	o := sluice.Options{
		Job:               h.job,
		OutputTopic:       OutputTopic,
		DLQTopic:          DeadLetterTopic,
		SideOutputTopics:  side,
		Backend:           h.opts.Backend,
		Guarantee:         h.opts.Guarantee,
		MaxOutOfOrderness: h.opts.MaxOutOfOrderness,
		Checkpoint: barrier.Config{
			Interval:          20 * time.Millisecond,
			Timeout:           9 * time.Second,
			TolerableFailures: 3,
		},
		TransactionTimeout: 10 * time.Second,
		SessionTimeout:     6 * time.Second,
		RebalanceTimeout:   4 * time.Second,
		Logger:             h.opts.Logger,
	}
	if h.opts.Configure != nil {
		h.opts.Configure(&o)
	}
	o.Brokers = h.brokers
	o.AppID = AppID
	o.InstanceID = instanceID
	o.InputTopics = slices.Clone(h.opts.InputTopics)
	o.StateDir = h.dir
	o.Clock = h.clock
	o.Registry = reg
	return o
}

// start starts an instance and waits until it owns every input partition.
func (h *Harness) start() {
	h.t.Helper()
	reg := prometheus.NewRegistry()
	in, err := sluice.New(h.options(reg))
	if err != nil {
		h.t.Fatalf("sluicetest: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	alive, dead := context.WithCancel(context.Background())
	cur := &instance{in: in, reg: reg, stop: stop, alive: alive, done: make(chan struct{})}
	go func() {
		cur.err = in.Run(ctx)
		close(cur.done)
		dead()
	}()
	h.cur = cur
	h.await("the instance to own every partition", func(context.Context) error {
		if n := h.runningTasks(); n != int(h.opts.Partitions) {
			return fmt.Errorf("%d of %d tasks running", n, h.opts.Partitions)
		}
		return nil
	})
}

// runningTasks is the instance's count of running tasks (sluice_tasks):
// assigned, restored, and fetching.
func (h *Harness) runningTasks() int {
	n, err := check.MetricSum(h.cur.reg, "sluice_tasks", "state", "running")
	if err != nil {
		return 0
	}
	return int(n)
}

// await polls cond with a short backoff until it returns nil. It fails the
// test when Options.Timeout passes, with cond's last answer, or when the
// instance stops by itself, with Run's error.
func (h *Harness) await(what string, cond func(ctx context.Context) error) {
	h.t.Helper()
	deadline := time.Now().Add(h.opts.Timeout)
	backoff := time.Millisecond
	var last error // cond's last answer that the deadline did not cut short
	for {
		select {
		case <-h.cur.done:
			h.t.Fatalf("sluicetest: waiting for %s: the instance stopped: %v", what, h.cur.err)
		default:
		}
		ctx, cancel := context.WithDeadline(h.cur.alive, deadline)
		err := cond(ctx)
		cancel()
		if err == nil {
			return
		}
		if last == nil || !errors.Is(err, context.DeadlineExceeded) {
			last = err
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("sluicetest: waited %s for %s: %v", h.opts.Timeout, what, last)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// Send produces a record to the input topic (the first of
// Options.InputTopics) and returns once the broker has acknowledged it. A
// record with a key goes to the partition Kafka's default (murmur2)
// partitioner picks for the key, one without to any partition; records
// sent one after another keep their order within a partition. ts is the
// record's Kafka timestamp (what sluice.KafkaTime reads); the zero time
// means the processing-time clock's Now.
func (h *Harness) Send(key, value []byte, ts time.Time, headers ...sluice.Header) {
	h.t.Helper()
	h.SendTo(h.opts.InputTopics[0], key, value, ts, headers...)
}

// SendTo is Send to topic, one of Options.InputTopics.
func (h *Harness) SendTo(topic string, key, value []byte, ts time.Time, headers ...sluice.Header) {
	h.t.Helper()
	if !slices.Contains(h.opts.InputTopics, topic) {
		h.t.Fatalf("sluicetest: SendTo(%q): not one of the input topics %q", topic, h.opts.InputTopics)
	}
	if ts.IsZero() {
		ts = h.Now()
	}
	r := &kgo.Record{Topic: topic, Key: key, Value: value, Timestamp: ts}
	for _, hd := range headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: hd.Key, Value: hd.Value})
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	if err := h.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		h.t.Fatalf("sluicetest: send: %v", err)
	}
}

// Now is the processing-time clock's reading: what the job's Context.Now
// returns and what processing-time timers and state TTLs run on.
func (h *Harness) Now() time.Time { return h.clock.Now() }

// Advance moves the processing-time clock forward by d and wakes the
// instance, which fires the processing-time timers that became due. It does
// not wait for them: Settle does. Epochs, transaction and session timeouts
// run on the wall clock and are not affected.
func (h *Harness) Advance(d time.Duration) {
	h.t.Helper()
	if d < 0 {
		h.t.Fatalf("sluicetest: Advance(%s): processing time does not go back", d)
	}
	h.clock.advance(d)
}

// Settle waits until everything sent so far is processed and committed,
// together with what it caused: the group's committed offsets (read
// require-stable, so no commit is pending) have reached every input's end,
// and the instance is quiet, with no epoch open and no timer due by the
// clock or the watermark. Then the outputs of every record sent and every
// timer due are readable with Output, SideOutput and DeadLetters.
//
// An event-time timer is due once the watermark reaches it; one a record
// registers at or behind the watermark fires right after that record (for
// a job with Prefetch, such as the function job, after its batch).
func (h *Harness) Settle() {
	h.t.Helper()
	if h.cur == nil {
		h.t.Fatalf("sluicetest: Settle: no instance is running (Restart one after Kill)")
	}
	h.await("everything sent to be processed and committed", h.settled)
}

func (h *Harness) settled(ctx context.Context) error {
	// The group's offsets alone would pass with a fresh instance that has
	// not taken its partitions yet (its predecessor committed them).
	if n := h.runningTasks(); n != int(h.opts.Partitions) {
		return fmt.Errorf("%d of %d tasks running", n, h.opts.Partitions)
	}
	ends, err := h.adm.ListEndOffsets(ctx, h.opts.InputTopics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("input end offsets: %w", err)
	}
	committed, err := h.adm.FetchOffsetsForTopics(kadm.RequireStable(ctx), AppID, h.opts.InputTopics...)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return fmt.Errorf("committed offsets: %w", err)
	}
	var behind error
	ends.Each(func(end kadm.ListedOffset) {
		if end.Offset == 0 || behind != nil {
			return
		}
		at := int64(-1)
		if c, ok := committed.Lookup(end.Topic, end.Partition); ok {
			at = c.At
		}
		if at < end.Offset {
			behind = fmt.Errorf("input %s partition %d: committed offset %d, end %d", end.Topic, end.Partition, at, end.Offset)
		}
	})
	if behind != nil {
		return behind
	}
	// After the offsets: a timer that the last records made due fires in
	// an epoch of its own, which Quiet waits for.
	quiet, err := testhook.Quiet(ctx, h.cur.in)
	switch {
	case err != nil:
		return fmt.Errorf("quiet: %w", err)
	case !quiet:
		return errors.New("the instance is busy: an epoch is open or a timer is due")
	}
	return nil
}

// Query reads key's committed state through fn, as sluice.Instance.Query
// does on the running instance: call it after Settle, and it reads what
// every record sent so far left there. fn reads through the job's own
// state descriptors:
//
//	var got int64
//	h.Query([]byte("ann"), func(s kstate.Scope) error {
//		var err error
//		got, _, err = count.Get(s)
//		return err
//	})
//
// An error from fn, or from the query, fails the test.
func (h *Harness) Query(key []byte, fn func(kstate.Scope) error) {
	h.t.Helper()
	if h.cur == nil {
		h.t.Fatalf("sluicetest: Query: no instance is running (Restart one after Kill)")
	}
	if err := h.cur.in.Query(key, fn); err != nil {
		h.t.Fatalf("sluicetest: Query(%q): %v", key, err)
	}
}

// QueryLocal reads every task's committed state through fn, as
// sluice.Instance.QueryLocal does: after Settle, the whole state every
// record sent so far left, task by task (a value state's All lists it). An
// error fails the test.
func (h *Harness) QueryLocal(fn func(task int32, s kstate.Scope) error) {
	h.t.Helper()
	if h.cur == nil {
		h.t.Fatalf("sluicetest: QueryLocal: no instance is running (Restart one after Kill)")
	}
	if err := h.cur.in.QueryLocal(fn); err != nil {
		h.t.Fatalf("sluicetest: QueryLocal: %v", err)
	}
}

// Kill stops the instance as a crash would, and returns once it has
// stopped: no final checkpoint, no leaving the group, its open transaction
// left to the broker. What it had not committed is lost with it; Restart
// starts its successor, which aborts that transaction, restores the state
// of the last committed epoch, and processes the rest again.
func (h *Harness) Kill() {
	h.t.Helper()
	if h.cur == nil {
		h.t.Fatalf("sluicetest: Kill: no instance is running")
	}
	testhook.Kill(h.cur.in)
	h.wait("the killed instance to stop")
}

// Restart starts a new instance with the same app id, instance id and
// state directory, and returns once it owns every input partition. An
// instance still running (not killed) is stopped gracefully first, with a
// final checkpoint.
func (h *Harness) Restart() {
	h.t.Helper()
	if h.cur != nil {
		h.cur.stop()
		h.wait("the instance to stop")
	}
	h.start()
}

// wait waits for the current instance's Run to return, and fails the test
// if it returned an error.
func (h *Harness) wait(what string) {
	h.t.Helper()
	cur := h.cur
	h.cur = nil
	select {
	case <-cur.done:
	case <-time.After(h.opts.Timeout):
		h.t.Fatalf("sluicetest: waited %s for %s", h.opts.Timeout, what)
	}
	if cur.err != nil {
		h.t.Fatalf("sluicetest: instance: %v", cur.err)
	}
}

// cleanup stops the instance gracefully at the end of the test.
func (h *Harness) cleanup() {
	cur := h.cur
	if cur == nil {
		return
	}
	h.cur = nil
	cur.stop()
	select {
	case <-cur.done:
		if cur.err != nil {
			h.t.Errorf("sluicetest: instance: %v", cur.err)
		}
	case <-time.After(h.opts.Timeout):
		h.t.Errorf("sluicetest: the instance did not stop within %s", h.opts.Timeout)
	}
}
