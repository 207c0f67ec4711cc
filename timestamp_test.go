package sluice_test

import (
	"context"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/sluicetest"
)

// stampsJob emits through each of the Context's four ways, from Process and
// from OnTimer, with the record's event time (the value, in milliseconds)
// or, for key "w", through WithTimestamp at the event time plus 5 s. Each
// output's value says where it came from.
func stampsJob(t *testing.T) sluice.Job {
	emitAll := func(ctx sluice.Context, from string) {
		k := ctx.Key()
		ctx.Emit(k, []byte(from+"/emit"))
		ctx.EmitTo("extra", k, []byte(from+"/emitto"))
		ctx.EmitToPartition("extra", 0, k, []byte(from+"/partition"))
		ctx.Output("side", k, []byte(from+"/output"))
	}
	return sluice.Job{
		Name: "stamps", Emits: true, EventTime: true, SideOutputs: []sluice.OutputTag{"side"},
		Timestamp: func(rec *sluice.Record) (time.Time, error) {
			ms, err := strconv.ParseInt(string(rec.Value), 10, 64)
			return time.UnixMilli(ms), err
		},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			if string(rec.Key) != "w" {
				emitAll(ctx, "process")
				ctx.Timers().RegisterEventTime(ctx.Timestamp().Add(10 * time.Millisecond))
				return nil
			}
			ts := ctx.Timestamp()
			at := ts.Add(5 * time.Second)
			w := sluice.WithTimestamp(ctx, at)
			if !w.Timestamp().Equal(at) {
				t.Errorf("WithTimestamp's Timestamp %v, want %v", w.Timestamp(), at)
			}
			emitAll(w, "with")
			// The second WithTimestamp replaces the first's time.
			sluice.WithTimestamp(w, at.Add(time.Second)).Emit(rec.Key, []byte("nested"))
			if !ctx.Timestamp().Equal(ts) {
				t.Errorf("ctx's Timestamp %v after WithTimestamp, want %v", ctx.Timestamp(), ts)
			}
			ctx.Emit(rec.Key, []byte("after"))
			return nil
		},
		OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
			emitAll(ctx, "timer")
			return nil
		},
	}
}

// stampsOf maps each record's value to its timestamp in milliseconds.
func stampsOf(recs []sluice.Record) map[string]int64 {
	m := map[string]int64{}
	for _, r := range recs {
		m[string(r.Key)+" "+string(r.Value)] = r.Timestamp.UnixMilli()
	}
	return m
}

// Outputs carry the event time of what is being handled, as in Kafka
// Streams and Flink: the record's (here the extractor's, not the Kafka
// record time) in Process, the timer's in OnTimer, and WithTimestamp's
// where the job gives one; through every way of emitting.
func TestOutputsCarryTheEventTime(t *testing.T) {
	h := sluicetest.New(t, stampsJob(t), sluicetest.Options{Topics: []string{"extra"}})
	kafkaTime := time.UnixMilli(1_000)
	h.Send([]byte("a"), []byte("1700000000000"), kafkaTime)
	h.Send([]byte("w"), []byte("1700000001000"), kafkaTime)
	h.Send([]byte("b"), []byte("1700000002000"), kafkaTime) // moves the watermark past a's timer
	h.Settle()

	got := stampsOf(slices.Concat(h.Output(), h.Records("extra"), h.SideOutput("side")))
	want := map[string]int64{}
	for _, how := range []string{"emit", "emitto", "partition", "output"} {
		want["a process/"+how] = 1700000000000
		want["a timer/"+how] = 1700000000010
		want["w with/"+how] = 1700000006000
		want["b process/"+how] = 1700000002000
	}
	want["w nested"] = 1700000007000
	want["w after"] = 1700000001000
	for k, ms := range want {
		if got[k] != ms {
			t.Errorf("%s: timestamp %d, want %d", k, got[k], ms)
		}
	}
	if t.Failed() {
		t.Logf("outputs: %v", got)
	}
}

// Without an extractor, outputs carry the input's Kafka record time.
func TestOutputsCarryTheKafkaTimeWithoutAnExtractor(t *testing.T) {
	job := sluice.Job{Name: "echo", Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, rec.Value)
			return nil
		}}
	h := sluicetest.New(t, job, sluicetest.Options{})
	at := time.Date(2020, 2, 3, 4, 5, 6, 7e6, time.UTC)
	h.Send([]byte("k"), []byte("v"), at)
	h.Settle()
	out := h.Output()
	if len(out) != 1 || !out[0].Timestamp.Equal(at) {
		t.Fatalf("outputs %v, want one at %v", out, at)
	}
}

// An event time Kafka cannot carry (before 1970) or franz-go cannot encode
// (after 2262) stamps the outputs with the processing time: under the
// harness's clock, which is not a wall clock, franz-go's wall time at
// produce.
func TestOutputsKafkaCannotStampCarryTheProcessingTime(t *testing.T) {
	far := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC) // a common "no end"
	job := sluice.Job{Name: "odd", Emits: true,
		Timestamp: func(rec *sluice.Record) (time.Time, error) {
			if string(rec.Value) == "far" {
				return far, nil
			}
			return time.UnixMilli(-86_400_000), nil
		},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, []byte("record"))
			sluice.WithTimestamp(ctx, time.UnixMilli(-1)).Emit(rec.Key, []byte("with"))
			sluice.WithTimestamp(ctx, time.Time{}).Emit(rec.Key, []byte("zero"))
			sluice.WithTimestamp(ctx, time.Date(2263, 1, 1, 0, 0, 0, 0, time.UTC)).Emit(rec.Key, []byte("2263"))
			return nil
		}}
	h := sluicetest.New(t, job, sluicetest.Options{})
	before := time.Now().Truncate(time.Millisecond)
	h.Send([]byte("k"), []byte("old"), time.UnixMilli(5_000))
	h.Send([]byte("k"), []byte("far"), time.UnixMilli(5_000))
	h.Settle()
	out := h.Output()
	if len(out) != 8 {
		t.Fatalf("%d outputs, want 8", len(out))
	}
	for _, r := range out {
		if r.Timestamp.Before(before) || r.Timestamp.After(time.Now()) {
			t.Errorf("%s: timestamp %v, want the wall time of its produce (after %v)", r.Value, r.Timestamp, before)
		}
	}
}

// fakeContext is a Context that is not the engine's: only Timestamp and
// Key are called.
type fakeContext struct{ jobContext }

// jobContext names sluice.Context for embedding (a field named Context
// would hide the method Context.Context).
type jobContext = sluice.Context

func (fakeContext) Timestamp() time.Time { return time.UnixMilli(1) }
func (fakeContext) Key() []byte          { return []byte("fake") }

// WithTimestamp of a Context that is not the engine's changes its
// Timestamp and leaves the rest to it.
func TestWithTimestampOfAnotherContext(t *testing.T) {
	at := time.UnixMilli(42)
	w := sluice.WithTimestamp(fakeContext{}, at)
	if !w.Timestamp().Equal(at) || string(w.Key()) != "fake" {
		t.Fatalf("Timestamp %v, Key %q; want %v, fake", w.Timestamp(), w.Key(), at)
	}
}

// WithTimestamp's Context is the engine's to the functions that take a
// Context: Forward stamps the forwarded record with its time, which the
// next stage's outputs carry; WriteRow finds the instance (and says it has
// no sink, not that the Context is not the engine's).
func TestWithTimestampForwardsAndWritesRows(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	first := sluice.Job{Name: "first",
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			w := sluice.WithTimestamp(ctx, ctx.Timestamp().Add(time.Hour))
			switch string(rec.Key) {
			case "row":
				return sluice.WriteRow(w, "row") // fails the record
			case "far": // a time franz-go cannot encode: processing time
				w = sluice.WithTimestamp(ctx, time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC))
			}
			return sluice.Forward(w, rec.Key, rec.Value)
		}}
	second := sluice.Job{Name: "second", Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, rec.Value)
			return nil
		}}
	opts := testOptions(brokers, "stamped-pipeline", sluice.Job{}, t.TempDir())
	opts.OutputTopic = "out"
	p, err := sluice.NewPipeline(opts, sluice.Stage{Name: "a", Job: first}, sluice.Stage{Name: "b", Job: second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	before := time.Now().Truncate(time.Millisecond)
	produceIn(t, brokers, []*kgo.Record{{Key: []byte("k"), Value: []byte("v"), Timestamp: at}, {Key: []byte("row"), Timestamp: at}, {Key: []byte("far"), Timestamp: at}})
	out, err := check.ReadCommitted(context.Background(), brokers, "out", 30*time.Second, check.Settled(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || !out[0].Timestamp.Equal(at.Add(time.Hour)) || out[1].Timestamp.Before(before) || out[1].Timestamp.After(time.Now()) {
		t.Fatalf("outputs %v, want k's at %v and far's at its produce", out, at.Add(time.Hour))
	}
	dlq, err := check.ReadCommitted(context.Background(), brokers, "stamped-pipeline-dlq", 30*time.Second, check.Settled(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(dlq) != 1 || !strings.Contains(header(dlq[0], sluice.HeaderError), "no sink") {
		t.Fatalf("dead letters %v, want row's, failed for want of a sink", dlq)
	}
}

// A broker refuses a timestamp out of the topic's bounds
// (message.timestamp.before.max.ms, after.max.ms) for good: the input whose
// output carries it goes to the dead-letter topic, stage emit, and the
// rest goes on, exactly once. It used to abort its epoch at every replay.
func TestRefusedTimestampGoesToDeadLetters(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	// The broker takes no timestamp after 2100 on "out" and on the
	// dead-letter topic, as message.timestamp.after.max.ms would.
	bound := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	defer cl.Close()
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, "dated-dlq"); err != nil {
		t.Fatal(err)
	}
	topics, err := adm.ListTopics(context.Background(), "out", "dated-dlq")
	if err != nil {
		t.Fatal(err)
	}
	// Requests from v13 on name topics by id alone.
	isOut := func(rt kmsg.ProduceRequestTopic) bool {
		for _, name := range []string{"out", "dated-dlq"} {
			if rt.Topic == name || rt.TopicID == topics[name].ID {
				return true
			}
		}
		return false
	}
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		refused := false
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				refused = refused || (isOut(rt) && maxTimestamp(rp.Records) > bound)
			}
		}
		if !refused {
			return nil, nil, false
		}
		// The others are not written; their client sends them again.
		resp := check.ProduceError(kreq, kerr.NotLeaderForPartition).(*kmsg.ProduceResponse)
		for ti, rt := range req.Topics {
			for pi, rp := range rt.Partitions {
				if isOut(rt) && maxTimestamp(rp.Records) > bound {
					resp.Topics[ti].Partitions[pi].ErrorCode = kerr.InvalidTimestamp.Code
				}
			}
		}
		return resp, nil, true
	})
	job := sluice.Job{Name: "dated", Emits: true,
		Timestamp: func(rec *sluice.Record) (time.Time, error) {
			if string(rec.Value) == "future" {
				return time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC), nil
			}
			return rec.Timestamp, nil
		},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, rec.Value)
			return nil
		}}
	opts := testOptions(brokers, "dated", job, t.TempDir())
	opts.OutputTopic = "out"
	opts.Checkpoint.TolerableFailures = 0 // a refused output is not a failed checkpoint
	startReady(t, opts)
	var recs []*kgo.Record
	for _, v := range []string{"1", "2", "future", "kafka-future", "3"} {
		r := &kgo.Record{Key: []byte("k"), Value: []byte(v)}
		if v == "kafka-future" {
			// Its dead letter, stamped with its Kafka time, is
			// refused too: it goes again stamped at its produce.
			r.Timestamp = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		recs = append(recs, r)
	}
	produceIn(t, brokers, recs)
	out, err := check.ReadCommitted(context.Background(), brokers, "out", 30*time.Second, check.Settled(3))
	if err != nil {
		t.Fatal(err)
	}
	var vals []string
	for _, r := range out {
		vals = append(vals, string(r.Value))
	}
	if got := strings.Join(vals, ","); got != "1,2,3" {
		t.Fatalf("outputs %s, want 1,2,3", got)
	}
	dlq, err := check.ReadCommitted(context.Background(), brokers, "dated-dlq", 30*time.Second, check.Settled(2))
	if err != nil {
		t.Fatal(err)
	}
	if len(dlq) != 2 {
		t.Fatalf("%d dead letters, want future's and kafka-future's", len(dlq))
	}
	for i, want := range []string{"future", "kafka-future"} {
		d := dlq[i]
		if string(d.Value) != want || header(d, sluice.HeaderStage) != "emit" || header(d, sluice.HeaderTruncated) != "" ||
			!strings.Contains(header(d, sluice.HeaderError), "INVALID_TIMESTAMP") || d.Timestamp.UnixMilli() > bound {
			t.Fatalf("dead letter %q at %v with headers %v, want %s's, whole, stage emit, INVALID_TIMESTAMP, before 2100", d.Value, d.Timestamp, d.Headers, want)
		}
	}
}

// maxTimestamp is the largest MaxTimestamp of the record batches in b.
func maxTimestamp(b []byte) int64 {
	largest := int64(math.MinInt64)
	for len(b) >= 12 {
		n := 12 + int(int32(binary.BigEndian.Uint32(b[8:12])))
		if n > len(b) {
			break
		}
		var batch kmsg.RecordBatch
		if batch.ReadFrom(b[:n]) == nil {
			largest = max(largest, batch.MaxTimestamp)
		}
		b = b[n:]
	}
	return largest
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
