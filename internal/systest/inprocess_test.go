package systest

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/kstate"
)

func TestAggregateExactlyOnceWithDeadLetters(t *testing.T) {
	brokers := newCluster(t, 4)
	f := newFeeder(t, brokers, 50, 1)
	// Four tasks processed at once (Options.Parallelism): the dead letters
	// and the aggregates are still exactly once.
	o := options(brokers, "agg", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	o.Parallelism = 4
	startInProcess(t, o)
	for range 10 {
		f.produce(200, 50)
	}
	rep := awaitAggregate(t, brokers, f, awaitIdle)
	if !rep.OK() || rep.Inputs != 1960 {
		t.Fatalf("aggregate: %v", rep)
	}
	dlq, err := check.ReadCommitted(context.Background(), []string{brokers}, "agg-dlq", 30*time.Second, check.Settled(f.bad))
	if err != nil {
		t.Fatal(err)
	}
	if len(dlq) != f.bad {
		t.Fatalf("dead letters: %d, want %d", len(dlq), f.bad)
	}
	hdr := map[string]string{}
	for _, h := range dlq[0].Headers {
		hdr[h.Key] = string(h.Value)
	}
	if hdr[sluice.HeaderStage] != "decode" || hdr[sluice.HeaderTopic] != input || hdr[sluice.HeaderError] == "" || hdr[sluice.HeaderOffset] == "" {
		t.Fatalf("dead-letter headers: %v", hdr)
	}
}

func TestEchoCopiesPartitionsInOrder(t *testing.T) {
	brokers := newCluster(t, 3)
	f := newFeeder(t, brokers, 100, 2)
	// In order per partition with the partitions processed at once, too.
	o := options(brokers, "echo", "i1", t.TempDir(), "echo", sluice.ExactlyOnce)
	o.Parallelism = 3
	startInProcess(t, o)
	for range 5 {
		f.produce(300, 0)
	}
	if rep := awaitEcho(t, brokers, f, awaitIdle); !rep.OK() || rep.Inputs != 1500 {
		t.Fatalf("echo: %v", rep)
	}
}

// restoreDone sums sluice_restore_records_done over tasks.
func restoreDone(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	sum, err := check.MetricSum(reg, "sluice_restore_records_done")
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// A restart with the state dir intact reads only the changelog tail (here:
// nothing); without it, the whole changelog. Both continue exactly once.
func TestRestartRestoresFromLocalStateOrChangelog(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 30, 3)
	dir := t.TempDir()
	p := startInProcess(t, options(brokers, "agg", "i1", dir, "aggregate", sluice.ExactlyOnce))
	f.produce(1000, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("first run: %v", rep)
	}
	p.stop(t)

	f.produce(500, 0)
	cfg := options(brokers, "agg", "i1", dir, "aggregate", sluice.ExactlyOnce)
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	p = startInProcess(t, cfg)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("after restart with state: %v", rep)
	}
	if n := restoreDone(t, reg); n != 0 {
		t.Errorf("restart with local state read %v changelog records, want 0", n)
	}
	p.stop(t)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	f.produce(500, 0)
	cfg = options(brokers, "agg", "i1", dir, "aggregate", sluice.ExactlyOnce)
	reg = prometheus.NewRegistry()
	cfg.Registry = reg
	startInProcess(t, cfg)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("after restart without state: %v", rep)
	}
	if n := restoreDone(t, reg); n < 30 {
		t.Errorf("restore without local state read %v changelog records, want at least one per key", n)
	}
}

// Partitions move between instances as they join and leave; the epoch in
// flight commits before its partitions go (or aborts and replays). Under
// both group protocols: a KIP-848 member that stops must leave with epoch
// -1, or its partitions stay reserved for it. And with pipelined epochs,
// where a rebalance waits for the commit under way.
func TestRebalanceKeepsExactlyOnce(t *testing.T) {
	type run struct {
		name, proto string
		pipelined   bool
	}
	var runs []run
	for _, proto := range protocols() {
		runs = append(runs, run{proto, proto, false})
	}
	runs = append(runs, run{runs[0].proto + ", pipelined epochs", runs[0].proto, true})
	for i, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			brokers := newCluster(t, 6)
			f := newFeeder(t, brokers, 60, uint64(4+10*i))
			start := func(id string) *inProcess {
				cfg := options(brokers, "agg", id, t.TempDir(), "aggregate", sluice.ExactlyOnce)
				cfg.GroupProtocol = r.proto
				cfg.PipelinedEpochs = r.pipelined
				return startInProcess(t, cfg)
			}
			a := start("a")
			a.awaitReady(t)
			f.produce(600, 0)
			b := start("b")
			for range 5 {
				f.produce(200, 0)
			}
			b.awaitReady(t)
			c := start("c")
			f.produce(600, 0)
			c.awaitReady(t)
			a.stop(t)
			f.produce(600, 0)
			b.stop(t)
			f.produce(600, 0)
			if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
				t.Fatalf("aggregate: %v", rep)
			}
			c.stop(t)
		})
	}
}

// counter keeps a count per key; the value "reset" deletes the key's state,
// which the changelog carries as a tombstone.
var count = kstate.Value[int64]("count", kstate.Int64())

func counterJob() sluice.Job {
	return sluice.Job{Name: "counter", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		if string(rec.Value) == "reset" {
			return count.Clear(ctx)
		}
		n, _, err := count.Get(ctx)
		if err != nil {
			return err
		}
		if err := count.Set(ctx, n+1); err != nil {
			return err
		}
		ctx.Emit(rec.Key, []byte(strconv.FormatInt(n+1, 10)))
		return nil
	}}
}

// Restore from a compacted changelog: tombstones delete, the newest value
// of every key and the newest marker survive compaction, and the restored
// state continues where it was.
func TestRestoreFromCompactedChangelog(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, input, output), kip848Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	send := func(key, value string, n int) {
		t.Helper()
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = &kgo.Record{Topic: input, Key: []byte(key), Value: []byte(value)}
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := func(dir string) sluice.Options {
		o := options(brokers, "ctr", "i1", dir, "aggregate", sluice.ExactlyOnce)
		o.Job = counterJob()
		if os.Getenv("SYSTEST_LOG_DIR") != "" {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		return o
	}
	dir := t.TempDir()
	p := startInProcess(t, cfg(dir))
	send("a", "+", 5)
	send("b", "+", 3)
	send("b", "reset", 1)
	send("c", "+", 2)
	waitOutputs(t, brokers, 10)
	p.stop(t)

	c.Compact()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	p = startInProcess(t, cfg(dir))
	send("a", "+", 1)
	send("b", "+", 1)
	send("c", "+", 1)
	recs := waitOutputs(t, brokers, 13)
	p.stop(t)
	got := map[string]string{}
	for _, r := range recs[10:] {
		got[string(r.Key)] = string(r.Value)
	}
	want := map[string]string{"a": "6", "b": "1", "c": "3"}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("after compacted restore: %v, want %v", got, want)
		}
	}
}

func waitOutputs(t *testing.T, brokers string, n int) []*kgo.Record {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, awaitIdle, func(r []*kgo.Record) bool { return len(r) >= n })
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n {
		t.Fatalf("read %d outputs, want %d", len(recs), n)
	}
	return recs
}

// A library user who sets only what has no default (brokers, app id,
// instance id, job, topics; the state directory only to keep the test's
// files in its temp dir) gets the binary's defaults: 100ms epochs, derived
// transaction, checkpoint, session and rebalance timeouts, topics created,
// exactly-once.
func TestLibraryDefaults(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 20, 7)
	startInProcess(t, sluice.Options{
		Brokers:     []string{brokers},
		AppID:       "defaults",
		InstanceID:  "i1",
		Job:         jobs.Aggregate(),
		InputTopics: []string{input},
		OutputTopic: output,
		StateDir:    t.TempDir(),
		Logger:      testLogger(),
	})
	f.produce(300, 30)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("with the library's defaults: %v", rep)
	}
}
