package sluicetest_test

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

// count is the counter job's state: records seen per key.
var count = kstate.Value[int64]("count", kstate.Int64())

// counter emits, for every record, its key and the key's running count, so
// that a duplicate or a lost input shows in the output.
var counter = sluice.Job{Name: "counter", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
	n, _, err := count.Get(ctx)
	if err != nil {
		return err
	}
	n++
	if err := count.Set(ctx, n); err != nil {
		return err
	}
	ctx.Emit(rec.Key, []byte(strconv.FormatInt(n, 10)))
	return nil
}}

// sendKeys sends n records, keys cycling through k0…k(keys-1), and counts
// them per key in sent.
func sendKeys(h *sluicetest.Harness, sent map[string]int64, n, keys int) {
	for i := range n {
		key := "k" + strconv.Itoa(i%keys)
		sent[key]++
		h.Send([]byte(key), []byte("x"), time.Time{})
	}
}

// checkCounts fails unless every key's outputs are exactly 1, 2, … up to
// the number of its inputs, in order: each input reflected once.
func checkCounts(t *testing.T, out []sluice.Record, sent map[string]int64) {
	t.Helper()
	got := map[string][]int64{}
	for _, r := range out {
		n, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil {
			t.Fatalf("output %s=%q: %v", r.Key, r.Value, err)
		}
		got[string(r.Key)] = append(got[string(r.Key)], n)
	}
	for key, n := range sent {
		want := make([]int64, n)
		for i := range want {
			want[i] = int64(i + 1)
		}
		if !slices.Equal(got[key], want) {
			t.Errorf("key %s: counts %v, want 1…%d", key, got[key], n)
		}
		delete(got, key)
	}
	for key, ns := range got {
		t.Errorf("key %s was never sent but has counts %v", key, ns)
	}
}

func TestCounter(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, counter, sluicetest.Options{Partitions: 3})
	sent := map[string]int64{}
	sendKeys(h, sent, 30, 5)
	h.Settle()
	out := h.Output()
	if len(out) != 30 {
		t.Fatalf("%d outputs, want 30", len(out))
	}
	checkCounts(t, out, sent)
	checkQueried(t, h, sent)
	for i := 1; i < len(out); i++ {
		a, b := out[i-1], out[i]
		if a.Partition > b.Partition || a.Partition == b.Partition && a.Offset >= b.Offset {
			t.Fatalf("outputs not in partition, offset order: %d/%d before %d/%d", a.Partition, a.Offset, b.Partition, b.Offset)
		}
	}
	if dl := h.DeadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters: %v", dl)
	}
}

// A crash mid-stream loses nothing and duplicates nothing: what the killed
// instance had not committed is aborted and processed again by the next.
func TestCounterKilledMidStream(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"bbolt", "memory"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, counter, sluicetest.Options{Partitions: 2, Backend: backend})
			sent := map[string]int64{}
			sendKeys(h, sent, 20, 4)
			h.Settle()
			sendKeys(h, sent, 40, 4)
			h.Kill()
			h.Restart()
			sendKeys(h, sent, 8, 4)
			h.Settle()
			checkCounts(t, h.Output(), sent)
			checkQueried(t, h, sent)
		})
	}
}

// checkQueried fails unless a query of each key's count, right after a
// Settle, reads the number of its inputs, and the tasks' counts listed
// (QueryLocal, All) are exactly those.
func checkQueried(t *testing.T, h *sluicetest.Harness, sent map[string]int64) {
	t.Helper()
	for key, n := range sent {
		h.Query([]byte(key), func(s kstate.Scope) error {
			got, ok, err := count.Get(s)
			if err == nil && (!ok || got != n) {
				err = fmt.Errorf("count %d (present %v), want %d", got, ok, n)
			}
			return err
		})
	}
	listed := map[string]int64{}
	h.QueryLocal(func(_ int32, s kstate.Scope) error {
		return count.All(s, func(key []byte, n int64) error {
			if _, dup := listed[string(key)]; dup {
				return fmt.Errorf("key %s listed twice", key)
			}
			listed[string(key)] = n
			return nil
		})
	})
	if !maps.Equal(listed, sent) {
		t.Errorf("the tasks list the counts %v, want %v", listed, sent)
	}
}

// A record that fails goes to the dead letters, with its state changes
// and outputs dropped.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	job := sluice.Job{Name: "strict", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		if _, err := strconv.Atoi(string(rec.Value)); err != nil {
			return err
		}
		ctx.Emit(rec.Key, rec.Value)
		return nil
	}}
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("a"), []byte("1"), time.Time{}, sluice.Header{Key: "trace", Value: []byte("t1")})
	h.Send([]byte("b"), []byte("one"), time.Time{})
	h.Settle()
	if out := h.Output(); len(out) != 1 || string(out[0].Value) != "1" {
		t.Fatalf("output %+v", out)
	}
	dl := h.DeadLetters()
	if len(dl) != 1 || string(dl[0].Key) != "b" || header(dl[0], "sluice.stage") != "process" {
		t.Fatalf("dead letters %+v", dl)
	}
}

func header(r sluice.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// reminder registers a processing-time timer a minute after each record and
// emits "fired" for the key when it fires.
var reminder = sluice.Job{
	Name:  "reminder",
	Emits: true,
	Process: func(ctx sluice.Context, rec *sluice.Record) error {
		ctx.Timers().RegisterProcessingTime(ctx.Now().Add(time.Minute))
		return nil
	},
	OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
		ctx.Emit(tm.Key, []byte("fired at "+ctx.Now().Format(time.TimeOnly)))
		return nil
	},
}

func outputs(recs []sluice.Record) string {
	var s []string
	for _, r := range recs {
		s = append(s, fmt.Sprintf("%s=%s", r.Key, r.Value))
	}
	return strings.Join(s, ", ")
}

// A processing-time timer fires once when the clock passes it, and a
// restart does not fire it again.
func TestProcessingTimeTimer(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, reminder, sluicetest.Options{})
	h.Send([]byte("a"), []byte("x"), time.Time{})
	h.Settle()
	h.Advance(59 * time.Second)
	h.Settle()
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("before its time: %s", outputs(out))
	}
	h.Advance(time.Second)
	h.Settle()
	const want = "a=fired at 00:01:00"
	if got := outputs(h.Output()); got != want {
		t.Fatalf("at its time: %q, want %q", got, want)
	}
	h.Kill()
	h.Restart()
	h.Advance(time.Minute)
	h.Settle()
	if got := outputs(h.Output()); got != want {
		t.Fatalf("after a restart: %q, want %q", got, want)
	}
}

// A timer registered by a committed epoch survives a crash: the restored
// instance fires it, once.
func TestProcessingTimeTimerSurvivesKill(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, reminder, sluicetest.Options{})
	h.Send([]byte("a"), []byte("x"), time.Time{})
	h.Settle()
	h.Kill()
	h.Restart()
	h.Settle()
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("before its time: %s", outputs(out))
	}
	h.Advance(2 * time.Minute)
	h.Settle()
	if got, want := outputs(h.Output()), "a=fired at 00:02:00"; got != want {
		t.Fatalf("after a restart: %q, want %q", got, want)
	}
}

// Run gives code outside a test function a TB: Fatalf stops it, cleanups
// run, and the failures come back as the error.
func TestRun(t *testing.T) {
	var steps []string
	err := sluicetest.Run(func(tb sluicetest.TB) {
		tb.Cleanup(func() { steps = append(steps, "cleanup 1") })
		tb.Cleanup(func() { steps = append(steps, "cleanup 2") })
		tb.Errorf("soft %d", 1)
		tb.Fatalf("hard %d", 2)
		steps = append(steps, "after Fatalf")
	})
	if err == nil || err.Error() != "soft 1\nhard 2" {
		t.Fatalf("Run returned %v", err)
	}
	if want := []string{"cleanup 2", "cleanup 1"}; !slices.Equal(steps, want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	if err := sluicetest.Run(func(sluicetest.TB) {}); err != nil {
		t.Fatalf("Run of nothing: %v", err)
	}
}

// An event-time timer registered at or behind the watermark fires right
// after the record that registered it (it used to wait for the next record
// to move the watermark, and Settle with it).
func TestEventTimerBehindWatermark(t *testing.T) {
	job := sluice.Job{
		Name: "echo-at", Emits: true, EventTime: true, Timestamp: sluice.KafkaTime,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Timers().RegisterEventTime(ctx.Timestamp())
			return nil
		},
		OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
			ctx.Emit(tm.Key, []byte(tm.At.UTC().Format(time.TimeOnly)))
			return nil
		},
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	t0 := h.Now()
	h.Send([]byte("a"), []byte("x"), t0.Add(time.Minute))
	h.Settle()
	h.Send([]byte("b"), []byte("x"), t0) // a minute behind the watermark
	h.Settle()
	if got, want := outputs(h.Output()), "a=00:01:00, b=00:00:00"; got != want {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// A timer registered through kstate.RegisterTimer, not the Context, fires
// too: the engine learns of registrations from the store.
func TestTimerRegisteredThroughKstate(t *testing.T) {
	job := sluice.Job{Name: "kstate-timer", Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			kstate.RegisterTimer(ctx, kstate.ProcessingTime, ctx.Now().Add(time.Minute))
			return nil
		},
		OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
			ctx.Emit(tm.Key, []byte("fired"))
			return nil
		},
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("k"), []byte("x"), time.Time{})
	h.Settle()
	h.Advance(2 * time.Minute)
	h.Settle()
	if got := outputs(h.Output()); got != "k=fired" {
		t.Fatalf("outputs %q, want k=fired", got)
	}
}

// An event-time timer that a processing-time timer's handler registers
// behind the watermark fires without waiting for another record.
func TestEventTimerFromProcessingTimer(t *testing.T) {
	job := sluice.Job{Name: "mixed", Emits: true, EventTime: true, Timestamp: sluice.KafkaTime,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Timers().RegisterProcessingTime(ctx.Now().Add(time.Minute))
			return nil
		},
		OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
			if tm.Domain == sluice.ProcessingTime {
				ctx.Timers().RegisterEventTime(ctx.CurrentWatermark().Add(-time.Hour))
				return nil
			}
			ctx.Emit(tm.Key, []byte("event"))
			return nil
		},
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("k"), []byte("x"), h.Now().Add(time.Hour))
	h.Settle()
	h.Advance(2 * time.Minute)
	h.Settle()
	if got := outputs(h.Output()); got != "k=event" {
		t.Fatalf("outputs %q, want k=event", got)
	}
}

// A job that reads several topics: SendTo feeds each, Send the first, the
// counts (shared keyed state) see them all, and Settle waits for every one
// of them.
func TestSeveralInputTopics(t *testing.T) {
	t.Parallel()
	tagged := sluice.Job{Name: "tagged", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		n, _, err := count.Get(ctx)
		if err != nil {
			return err
		}
		if err := count.Set(ctx, n+1); err != nil {
			return err
		}
		ctx.Emit(rec.Key, fmt.Appendf(nil, "%s:%d", rec.Topic, n+1))
		return nil
	}}
	h := sluicetest.New(t, tagged, sluicetest.Options{Partitions: 2, InputTopics: []string{"left", "right"}})
	for i := range 6 {
		h.SendTo([]string{"left", "right"}[i%2], []byte("k"), []byte("x"), time.Time{})
	}
	h.Send([]byte("k"), []byte("x"), time.Time{}) // the first input topic
	h.Settle()
	var got []string
	for _, r := range h.Output() {
		got = append(got, string(r.Value))
	}
	topics := map[string]int{}
	for i, v := range got {
		topic, n, _ := strings.Cut(v, ":")
		topics[topic]++
		if n != strconv.Itoa(i+1) {
			t.Fatalf("outputs %q: want counts 1…7 in order", got)
		}
	}
	if len(got) != 7 || topics["left"] != 4 || topics["right"] != 3 {
		t.Fatalf("outputs %q: want 4 from left and 3 from right", got)
	}
}
