package sluice_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/txsink/pgsink"
)

// With Options.PipelinedEpochs, the inputs polled while an epoch's flush
// waits for the broker are processed (sluice_overlapped_records_total), but
// none of their outputs reaches Kafka before that epoch's transaction
// ended: they go out in the next one. Whether the epoch then commits, or
// aborts and takes the next one with it, every input is reflected exactly
// once in the read_committed output and in the task files.
//
// The flush is held deterministically: the broker sleeps on the instance's
// first produce request after the first half of the input was consumed
// (the next input's output), and the second half comes after that epoch's
// barrier, until the test has seen it processed.
//
// With a sink (PostgreSQL, the aggregate table), the held epoch's rows are
// its own: once it committed, and before the next epoch's EndTxn, the table
// holds the inputs up to it and none after; in the end it holds every
// input once, and nothing is left prepared.
func TestPipelinedEpochs(t *testing.T) {
	pg := pgtest.Start(t) // for the cases with a sink
	for i, tt := range []struct {
		name  string
		abort bool // the held epoch's TxnOffsetCommit fails
		sink  bool // the job writes its rows to PostgreSQL too
	}{
		{"the epoch commits", false, false},
		{"the epoch aborts and takes the next with it", true, false},
		{"with a sink, the epoch commits", false, true},
		{"with a sink, the epoch aborts and takes the next with it", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, adm := pipelinedCluster(t)
			brokers := c.ListenAddrs()
			app := "pipelined"
			state := filepath.Join(t.TempDir(), "s")
			opts := aggregateOptions(brokers, app, state)
			opts.PipelinedEpochs = true
			opts.Checkpoint.Timeout = 40 * time.Second // the test holds a flush
			opts.ClientOpts = holdableProduce
			var url string
			if tt.sink {
				url = pg.Database(t, "pipelined"+strconv.Itoa(i))
				withAggregateSink(t, &opts, url)
			}
			// committedAt is the group's committed offsets (their sum)
			// and outputsAt the outputs a read_committed reader sees
			// when the first epoch committed after the hold was
			// released (the loop's goroutine calls the hook); rowsAt
			// is the inputs the sink's table reflects at the next
			// epoch's EndTxn.
			h := &flushHold{}
			var released atomic.Bool
			committedAt, outputsAt, rowsAt := int64(-1), -1, int64(-1)
			opts.Hook = func(p string) {
				h.hook(p)
				switch {
				case p == sluice.PointAfterCommit && released.Load() && committedAt < 0:
					sum, err := check.CommittedSum(context.Background(), adm, app)
					if err != nil {
						t.Error(err)
					}
					committedAt = sum
					outputsAt = len(readOutputs(t, brokers, "out", kgo.ReadCommitted()))
				case p == sluice.PointBeforeCommit && tt.sink && committedAt >= 0 && rowsAt < 0:
					// On the loop's goroutine: an error is reported,
					// not raised (t.Fatal would end the goroutine).
					if err := pgQuery(url, "SELECT COALESCE(SUM(count), 0)::bigint FROM results", func(r pgx.Rows) error { return r.Scan(&rowsAt) }); err != nil {
						t.Error(err)
					}
				}
			}
			reg := opts.Registry.(*prometheus.Registry)
			r := startReady(t, opts)
			metric := func(name string, labels ...string) float64 { return metricOf(t, reg, name, labels...) }

			const half = applyKeys * applyPerKey / 2
			produceAggregateRange(t, brokers, 0, half)
			waitUntil(t, "the first half consumed", func() bool { return consumedAll(adm, app, half)(r.inst) })

			h.arm(t, c, adm)
			if tt.abort {
				c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
					return check.TxnOffsetCommitError(kreq, kerr.IllegalGeneration), nil, true
				})
			}
			// One input opens an epoch whose produce is held; the rest
			// arrives once its barrier passed, while its flush waits.
			produceAggregateRange(t, brokers, half, half+1)
			waitUntil(t, "the barrier of an epoch whose produce is held", h.holding)
			produceAggregateRange(t, brokers, half+1, 2*half)
			overlapped := func() bool { return metric("sluice_overlapped_records_total") >= half-1 }
			waitUntil(t, "the rest processed behind the held epoch", overlapped)
			if out := len(readOutputs(t, brokers, "out", kgo.ReadUncommitted())); out > half+1 {
				t.Fatalf("%d outputs in the log while the epoch of input %d commits: more than the %d inputs before it, so the next epoch's outputs were produced into it", out, half, half+1)
			}
			released.Store(true)
			close(h.release)

			waitUntil(t, "the whole input consumed", func() bool { return consumedAll(adm, app, 2*half)(r.inst) })
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			// The held epoch committed its own offsets, not the
			// consumer's positions, which were past the second half.
			if !tt.abort && committedAt != half+1 {
				t.Fatalf("the held epoch committed offsets adding up to %d, want %d", committedAt, half+1)
			}
			// And its outputs alone: the next epoch's were held.
			if !tt.abort && outputsAt != half+1 {
				t.Fatalf("%d outputs committed with the held epoch, want %d", outputsAt, half+1)
			}
			// And its rows alone: the next epoch's went into a sink
			// transaction of their own, prepared at its own commit.
			if tt.sink && !tt.abort && rowsAt != half+1 {
				t.Fatalf("the table reflected %d inputs between the held epoch's commit and the next one's, want %d", rowsAt, half+1)
			}
			aborts := metric("sluice_transactions_total", "result", "abort")
			if tt.abort != (aborts > 0) {
				t.Fatalf("%v transactions aborted; want them to abort: %v", aborts, tt.abort)
			}
			outputs, err := check.ReadCommitted(context.Background(), brokers, "out", 30*time.Second, check.Settled(2*half))
			if err != nil {
				t.Fatal(err)
			}
			if rep := check.Aggregate(aggregateInputs(2*half), outputs); !rep.OK() {
				t.Fatalf("read_committed output: %v", rep)
			}
			checkAggregations(t, state, app)
			if tt.sink {
				checkAggregateTable(t, url, aggregateInputs(2*half))
			}
		})
	}
}

// withAggregateSink makes opts's job the aggregate job writing its rows to
// PostgreSQL at url as well, upserted by key into the table "results".
func withAggregateSink(t *testing.T, opts *sluice.Options, url string) {
	t.Helper()
	opts.Job = jobs.AggregateWith(jobs.AggregateOptions{Emit: true, Rows: true})
	s, err := pgsink.New(pgsink.Config{
		URL: url, App: opts.AppID, Table: "results", Key: []string{"key"},
		Columns: pgsink.Named(jobs.AggregateColumns, pgsink.Text, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	opts.Sink = s
}

// checkAggregateTable checks that the aggregate table at url holds each
// key's aggregation of inputs exactly, and that nothing is left prepared.
func checkAggregateTable(t *testing.T, url string, inputs map[string][]int64) {
	t.Helper()
	got := map[string]string{}
	err := pgQuery(url, "SELECT key, count, sum, min, max FROM results", func(r pgx.Rows) error {
		var k string
		var count, sum, lo, hi int64
		err := r.Scan(&k, &count, &sum, &lo, &hi)
		got[k] = fmt.Sprint(count, sum, lo, hi)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range inputs {
		a := check.Aggregation{Min: vs[0], Max: vs[0]}
		for _, v := range vs {
			a.Count++
			a.Sum += v
			a.Min, a.Max = min(a.Min, v), max(a.Max, v)
		}
		if want := fmt.Sprint(a.Count, a.Sum, a.Min, a.Max); got[k] != want {
			t.Fatalf("table row %s = %q, want %q", k, got[k], want)
		}
	}
	if len(got) != len(inputs) {
		t.Fatalf("table has %d keys, want %d", len(got), len(inputs))
	}
	var prepared int64
	if err := pgQuery(url, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()", func(r pgx.Rows) error { return r.Scan(&prepared) }); err != nil {
		t.Fatal(err)
	}
	if prepared != 0 {
		t.Fatalf("%d sink transactions left prepared", prepared)
	}
}

// pgQuery runs sql at url, calling scan for each row.
func pgQuery(url, sql string, scan func(pgx.Rows) error) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// pipelinedCluster starts a one-broker cluster with topics "in" and "out"
// of 4 partitions, and returns it with an admin client of it.
func pipelinedCluster(t *testing.T) (*kfake.Cluster, *kadm.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c, kadm.NewClient(cl)
}

// flushHold holds an epoch's flush at the broker: once armed, the broker
// sleeps on the instance's next produce request (not one to "in") until
// release is closed. Its hook, called by the instance's Options.Hook,
// counts the epochs ended since it was armed: the first is the held
// epoch's, provided no epoch with work was open when it was armed, and its
// barrier may come before or after its produce reaches the broker (the
// flush sends what lingers).
type flushHold struct {
	watching, sleeping atomic.Bool
	barriers           atomic.Int32
	release            chan struct{}
}

func (h *flushHold) hook(p string) {
	if p == sluice.PointBeforePreCommit && h.watching.Load() {
		h.barriers.Add(1)
	}
}

// arm installs the hold on c.
func (h *flushHold) arm(t *testing.T, c *kfake.Cluster, adm *kadm.Client) {
	t.Helper()
	topics, err := adm.ListTopics(context.Background(), "in")
	if err != nil {
		t.Fatal(err)
	}
	inID := topics["in"].ID
	h.release = make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if writesTo(kreq.(*kmsg.ProduceRequest), "in", inID) || !armed.CompareAndSwap(true, false) {
			return nil, nil, false
		}
		h.sleeping.Store(true)
		c.SleepControl(func() { <-h.release }) // holds the epoch's flush
		return nil, nil, false
	})
	h.watching.Store(true)
}

// holdableProduce are client options for an instance whose produce a
// flushHold holds: the client gives up on a produce request after its
// timeout (10 s by default, plus the engine's 5 s overhead) and sends it
// again, unheld, which would end the hold early on a slow machine. The
// hold's limit is then the flush's, Checkpoint.Timeout (40 s in these
// tests).
var holdableProduce = []kgo.Opt{kgo.ProduceRequestTimeout(2 * time.Minute)}

// holding reports whether an epoch's barrier passed and its flush is held.
func (h *flushHold) holding() bool { return h.barriers.Load() > 0 && h.sleeping.Load() }

// metricOf is the sum of the series of name (with the label pairs) in reg.
func metricOf(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, err := check.MetricSum(reg, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Timers fire during an overlap, in the epoch being processed, as records
// are processed (found by review: they waited for the phase to be
// processing again, which a loop whose every commit overlaps the next
// epoch never saw). Each input registers a processing-time timer due at
// once, whose firing emits the one output; while the first input's epoch
// is held, the others' timers fire, and every timer's output is committed
// once.
func TestPipelinedEpochsFireTimersDuringTheOverlap(t *testing.T) {
	c, adm := pipelinedCluster(t)
	brokers := c.ListenAddrs()
	job := sluice.Job{Name: "ticks", Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Timers().RegisterProcessingTime(ctx.Now())
			return nil
		},
		OnTimer: func(ctx sluice.Context, _ sluice.Timer) error {
			ctx.Emit(ctx.Key(), []byte("fired"))
			return nil
		},
	}
	opts := testOptions(brokers, "pipelined-timers", job, t.TempDir())
	opts.OutputTopic, opts.PipelinedEpochs = "out", true
	opts.Checkpoint.Timeout = 40 * time.Second // the test holds a flush
	opts.ClientOpts = holdableProduce
	h := &flushHold{}
	opts.Hook = h.hook
	reg := opts.Registry.(*prometheus.Registry)
	r := startReady(t, opts)
	h.arm(t, c, adm)
	const n = 200 // inputs, each of a key of its own
	produceKeys(t, brokers, 0, 1)
	waitUntil(t, "the barrier of an epoch whose produce is held", h.holding)
	fired := metricOf(t, reg, "sluice_timers_fired_total")
	committed := metricOf(t, reg, "sluice_epochs_committed_total")
	produceKeys(t, brokers, 1, n)
	waitUntil(t, "the timers of the inputs behind the held epoch fired", func() bool {
		return metricOf(t, reg, "sluice_timers_fired_total") >= fired+n-1
	})
	// During the overlap, not after it: the held epoch has not committed
	// (holdableProduce keeps the client from giving up on the held
	// request and sending it again, which would end the overlap).
	if now := metricOf(t, reg, "sluice_epochs_committed_total"); now != committed {
		t.Fatalf("%v epochs committed before the timers fired, want none: they waited for the held epoch", now-committed)
	}
	close(h.release)
	waitUntil(t, "the input consumed", func() bool { return consumedAll(adm, "pipelined-timers", n)(r.inst) })
	outputs, err := check.ReadCommitted(context.Background(), brokers, "out", 30*time.Second, check.Settled(n))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for _, o := range outputs {
		keys[string(o.Key)]++
	}
	if len(outputs) != n || len(keys) != n {
		t.Fatalf("%d outputs of %d keys, want one for each of %d", len(outputs), len(keys), n)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// produceKeys writes inputs from to to, input i keyed "t<i>", to
// partition i%4.
func produceKeys(t *testing.T, brokers []string, from, to int) {
	t.Helper()
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("t%d", i)), Value: []byte("1"), Partition: int32(i % 4)})
	}
	produceIn(t, brokers, recs)
}

// writesTo reports whether the produce request writes to the topic of that
// name or id (requests from v13 on carry the id alone).
func writesTo(req *kmsg.ProduceRequest, topic string, id [16]byte) bool {
	for _, rt := range req.Topics {
		if rt.Topic == topic || rt.TopicID == id {
			return true
		}
	}
	return false
}

// readOutputs reads topic at the isolation level to where it ends now (its
// high-water marks reading uncommitted, its last stable offsets reading
// committed), not until no record arrived for a while: a reader that gave
// up after 300 ms saw 103 of 501 committed outputs on a busy machine.
func readOutputs(t *testing.T, brokers []string, topic string, level kgo.IsolationLevel) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs, err := check.ReadToEnd(ctx, brokers, topic, level)
	if err != nil {
		t.Error(err)
	}
	return recs
}

// aggregateInputs are the values produceAggregateRange wrote from 0 to n,
// per key, in order.
func aggregateInputs(n int) map[string][]int64 {
	in := map[string][]int64{}
	for v := range n {
		k := fmt.Sprintf("k%02d", v%applyKeys)
		in[k] = append(in[k], int64(v))
	}
	return in
}

// Pipelined epochs overlap a Kafka transaction's commit: at-least-once,
// which has none, refuses the option rather than ignoring it.
func TestPipelinedEpochsNeedExactlyOnce(t *testing.T) {
	opts := aggregateOptions([]string{"127.0.0.1:1"}, "pipelined-alos", t.TempDir())
	opts.Guarantee, opts.PipelinedEpochs = sluice.AtLeastOnce, true
	if _, err := sluice.New(opts); err == nil || !strings.Contains(err.Error(), "PipelinedEpochs needs Options.Guarantee exactly_once") {
		t.Fatalf("New = %v, want the option refused", err)
	}
}
