package window_test

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// assigners are the event-time window kinds with their batch recomputation.
var assigners = []struct {
	name     string
	assigner window.Assigner
	batch    func([]elem) []string
}{
	{"tumbling", window.TumblingEventTime(10 * time.Second), func(es []elem) []string { return batchFixed(es, 10000, 10000, 0) }},
	{"sliding", window.SlidingEventTime(10*time.Second, 5*time.Second), func(es []elem) []string { return batchFixed(es, 10000, 5000, 0) }},
	{"sliding-uneven", window.SlidingEventTime(10*time.Second, 3*time.Second), func(es []elem) []string { return batchFixed(es, 10000, 3000, 0) }},
	{"session", window.EventTimeSession(4500 * time.Millisecond), func(es []elem) []string { return batchSessions(es, 4500) }},
	{"tumbling-offset", window.TumblingEventTime(10 * time.Second).WithOffset(3 * time.Second), func(es []elem) []string { return batchFixed(es, 10000, 10000, 3000) }},
	{"sliding-offset", window.SlidingEventTime(10*time.Second, 5*time.Second).WithOffset(-2 * time.Second), func(es []elem) []string { return batchFixed(es, 10000, 5000, -2000) }},
}

// Each window kind and function, in event time, on an out-of-order stream
// with no late element, gives exactly the windows a batch computation over
// the whole stream gives: every window once, with all its elements.
func TestEventTimeMatchesBatch(t *testing.T) {
	t.Parallel()
	for i, a := range assigners {
		for _, f := range functions {
			t.Run(a.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				es := stream(uint64(i+1), 300)
				h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{Assigner: a.assigner, Function: f.fn}),
					sluicetest.Options{MaxOutOfOrderness: outOfOrder})
				send(h, es...)
				send(h, flush(es))
				h.Settle()
				expectSorted(t, "windows", values(h.Output()), a.batch(es))
				expectStampedAtMaxTimestamp(t, h.Output())
				if dl := h.DeadLetters(); len(dl) > 0 {
					t.Fatalf("dead letters: %v", values(dl))
				}
			})
		}
	}
}

// Processing-time windows run on the clock: a record joins the window that
// holds Context.Now, and windows fire when the clock reaches their end,
// with no record needed.
func TestProcessingTime(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the harness's default clock
	ms := func(d time.Duration) int64 { return start.Add(d).UnixMilli() }
	tests := []struct {
		name     string
		assigner window.Assigner
		steps    []any // elem: send it; time.Duration: advance the clock
		want     []string
	}{
		{
			name:     "tumbling",
			assigner: window.TumblingProcessingTime(time.Minute),
			steps:    []any{elem{Key: "a", V: 1}, elem{Key: "b", V: 2}, 30 * time.Second, elem{Key: "a", V: 3}, 40 * time.Second, elem{Key: "a", V: 4}, 2 * time.Minute},
			want: []string{
				line("a", ms(0), ms(time.Minute), result{2, 4}),
				line("b", ms(0), ms(time.Minute), result{1, 2}),
				line("a", ms(time.Minute), ms(2*time.Minute), result{1, 4}),
			},
		},
		{
			name:     "sliding",
			assigner: window.SlidingProcessingTime(time.Minute, 30*time.Second),
			steps:    []any{elem{Key: "a", V: 1}, 40 * time.Second, elem{Key: "a", V: 2}, 2 * time.Minute},
			want: []string{
				line("a", ms(-30*time.Second), ms(30*time.Second), result{1, 1}),
				line("a", ms(0), ms(time.Minute), result{2, 3}),
				line("a", ms(30*time.Second), ms(90*time.Second), result{1, 2}),
			},
		},
		{
			name:     "session",
			assigner: window.ProcessingTimeSession(time.Minute),
			steps:    []any{elem{Key: "a", V: 1}, 50 * time.Second, elem{Key: "a", V: 2}, 50 * time.Second, elem{Key: "a", V: 3}, 61 * time.Second, elem{Key: "a", V: 4}, 2 * time.Minute},
			want: []string{
				line("a", ms(0), ms(160*time.Second), result{3, 6}),
				line("a", ms(161*time.Second), ms(221*time.Second), result{1, 4}),
			},
		},
	}
	for _, tt := range tests {
		for _, f := range functions {
			t.Run(tt.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{Assigner: tt.assigner, Function: f.fn}), sluicetest.Options{})
				for _, s := range tt.steps {
					switch s := s.(type) {
					case elem:
						send(h, s)
						h.Settle() // processed at this clock reading
					case time.Duration:
						h.Advance(s)
						h.Settle()
					}
				}
				expectInOrder(t, "windows", values(h.Output()), tt.want...)
				expectStampedAtMaxTimestamp(t, h.Output())
			})
		}
	}
}

var late = sluice.OutputTag("late")

// Allowed lateness: a window fires when the watermark reaches its end and
// stays for the lateness; an element within it updates the window and fires
// it again with everything it holds (a late firing); at end + lateness the
// window is cleared, and an element later than that goes to the late side
// output, or is dropped and counted.
func TestAllowedLateness(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	steps := []elem{
		a(1, 1), a(4, 2),
		a(10, 3), // watermark 10: [0,10) fires
		a(5, 4),  // within the lateness: fires again
		a(12, 5),
		a(3, 6),  // fires again
		a(15, 7), // watermark 15 = 10 + lateness: [0,10) is cleared
		a(2, 8),  // too late
		a(14, 9), // [10,20) has not fired: joins it, no firing
		a(40, 0), // [10,20) fires; and [20,30) for nothing: no window
	}
	want := []string{
		line("a", at(0), at(10), result{2, 3}),
		line("a", at(0), at(10), result{3, 7}),
		line("a", at(0), at(10), result{4, 13}),
		line("a", at(10), at(20), result{4, 24}),
	}
	for _, f := range functions {
		t.Run(f.name+"/side-output", func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
				Assigner: window.TumblingEventTime(10 * time.Second), Function: f.fn,
				AllowedLateness: 5 * time.Second, LateOutput: late,
			}), sluicetest.Options{})
			send(h, steps...)
			h.Settle()
			expectInOrder(t, "windows", values(h.Output()), want...)
			// Late firings too; the late record keeps its own time.
			expectStampedAtMaxTimestamp(t, h.Output())
			expectInOrder(t, "late side output", values(h.SideOutput(late)), string(a(2, 8).value()))
			lr := h.SideOutput(late)[0]
			if ts := lr.Timestamp.UnixMilli(); ts != at(2) {
				t.Fatalf("late record stamped %d, want its event time %d", ts, at(2))
			}
			if i := slices.IndexFunc(lr.Headers, func(hd sluice.Header) bool { return hd.Key == sluice.HeaderTopic }); i < 0 || string(lr.Headers[i].Value) != sluicetest.InputTopic {
				t.Fatalf("late record's headers %v, want %s naming its topic", lr.Headers, sluice.HeaderTopic)
			}
		})
		t.Run(f.name+"/dropped", func(t *testing.T) {
			t.Parallel()
			dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"})
			h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
				Assigner: window.TumblingEventTime(10 * time.Second), Function: f.fn,
				AllowedLateness: 5 * time.Second, LateDropped: dropped,
			}), sluicetest.Options{})
			send(h, steps...)
			h.Settle()
			expectInOrder(t, "windows", values(h.Output()), want...)
			var m dto.Metric
			if err := dropped.Write(&m); err != nil {
				t.Fatal(err)
			}
			if n := m.GetCounter().GetValue(); n != 1 {
				t.Fatalf("LateDropped = %v, want 1", n)
			}
		})
	}
}

// Without lateness the same stream loses every element behind a fired
// window, and a sliding element late for some of its windows still counts
// in the others.
func TestLateWithoutLateness(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.SlidingEventTime(10*time.Second, 5*time.Second), Function: functions[0].fn, LateOutput: late,
	}), sluicetest.Options{})
	send(h, a(1, 1), a(10, 2), // [−5,5) and [0,10) fire
		a(7, 3),  // [0,10) fired: too late for it, on time for [5,15)
		a(4, 4),  // too late for [−5,5) and [0,10): side output
		a(30, 0)) // the rest fire
	h.Settle()
	expectInOrder(t, "windows", values(h.Output()),
		line("a", at(-5), at(5), result{1, 1}),
		line("a", at(0), at(10), result{1, 1}),
		line("a", at(5), at(15), result{2, 5}),
		line("a", at(10), at(20), result{1, 2}),
	)
	expectInOrder(t, "late", values(h.SideOutput(late)), string(a(4, 4).value()))
}

// A record that bridges two sessions merges them, state and timers: the
// merged session fires once with the elements of both.
func TestSessionMerge(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	for _, f := range functions {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
				Assigner: window.EventTimeSession(10 * time.Second), Function: f.fn,
			}), sluicetest.Options{MaxOutOfOrderness: time.Minute})
			send(h,
				a(0, 1),   // [0,10)
				a(30, 2),  // [30,40)
				a(15, 4),  // [15,25): touches neither
				a(21, 8),  // [21,31) bridges [15,25) and [30,40): [15,40)
				a(12, 16), // [12,22) joins it: [12,40)
				a(5, 32),  // [5,15) bridges [0,10) and [12,40): [0,40)
				a(45, 64), // [45,55): apart
				elem{Key: "a", T: at(200)})
			h.Settle()
			expectInOrder(t, "sessions", values(h.Output()),
				line("a", at(0), at(40), result{6, 63}),
				line("a", at(45), at(55), result{1, 64}),
			)
		})
	}
}

// Timers are one per key, domain and millisecond, so windows of a key can
// share one: here session A's cleanup time is session B's end. Merging B
// away must not delete the timer A still needs, or A would never be
// cleared and a later element would merge into it.
func TestSessionMergeKeepsSharedTimer(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.EventTimeSession(3 * time.Second), Function: functions[0].fn, AllowedLateness: 12 * time.Second,
	}), sluicetest.Options{})
	send(h,
		a(0, 1),  // A = [0,3): timers at 3 and 15
		a(12, 2), // A fires; B = [12,15): timers at 15 and 27
		a(13, 4), // B becomes [12,16): B's 15 is A's cleanup, kept
		elem{Key: "b", T: at(15)},
		a(2, 8), // A was cleared at 15: a new session [2,5), behind the watermark: fires at once
		elem{Key: "b", T: at(100)})
	h.Settle()
	expectInOrder(t, "sessions", withoutFlushB(values(h.Output())),
		line("a", at(0), at(3), result{1, 1}),
		line("a", at(2), at(5), result{1, 8}),
		line("a", at(12), at(16), result{2, 6}),
	)
}

func withoutFlushB(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l[0] != 'b' {
			out = append(out, l)
		}
	}
	return out
}

// A crash mid-window loses nothing and repeats nothing: the successor
// restores the windows and timers of the last committed epoch, replays the
// rest, and the output is the batch result exactly once, on both backends.
func TestKillMidWindow(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"bbolt", "memory"} {
		for _, a := range []int{0, 3} { // tumbling, session
			for _, f := range functions[:2] {
				t.Run(fmt.Sprintf("%s/%s/%s", backend, assigners[a].name, f.name), func(t *testing.T) {
					t.Parallel()
					es := stream(42, 400)
					h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
						Assigner: assigners[a].assigner, Function: f.fn, AllowedLateness: 2 * time.Second,
					}), sluicetest.Options{MaxOutOfOrderness: outOfOrder, Backend: backend})
					send(h, es[:150]...)
					h.Settle()
					send(h, es[150:300]...) // some of it committed, some not
					h.Kill()
					h.Restart()
					send(h, es[300:]...)
					send(h, flush(es))
					h.Settle()
					expectSorted(t, "windows", withoutFlush(values(h.Output())), assigners[a].batch(es))
				})
			}
		}
	}
}

// Job refuses a spec it cannot run, before any I/O.
func TestSpecValidation(t *testing.T) {
	t.Parallel()
	ok := window.Spec[elem, result]{
		Name: "w", Assigner: window.TumblingEventTime(time.Second), Function: functions[0].fn,
		Decode: decode, Encode: encode, Timestamp: timestamp,
	}
	type noMerge struct{ sum }
	tests := []struct {
		name   string
		change func(*window.Spec[elem, result])
	}{
		{"no name", func(s *window.Spec[elem, result]) { s.Name = "" }},
		{"no assigner", func(s *window.Spec[elem, result]) { s.Assigner = window.Assigner{} }},
		{"zero size", func(s *window.Spec[elem, result]) { s.Assigner = window.TumblingEventTime(0) }},
		{"zero slide", func(s *window.Spec[elem, result]) { s.Assigner = window.SlidingEventTime(time.Second, 0) }},
		{"zero gap", func(s *window.Spec[elem, result]) { s.Assigner = window.EventTimeSession(0) }},
		{"no function", func(s *window.Spec[elem, result]) { s.Function = window.Function[elem, result]{} }},
		{"nil codec", func(s *window.Spec[elem, result]) { s.Function = window.Process[elem, result](nil, nil) }},
		{"no decode", func(s *window.Spec[elem, result]) { s.Decode = nil }},
		{"no encode", func(s *window.Spec[elem, result]) { s.Encode = nil }},
		{"no timestamp", func(s *window.Spec[elem, result]) { s.Timestamp = nil }},
		{"negative lateness", func(s *window.Spec[elem, result]) { s.AllowedLateness = -time.Second }},
		{"lateness in processing time", func(s *window.Spec[elem, result]) {
			s.Assigner, s.AllowedLateness = window.TumblingProcessingTime(time.Second), time.Second
		}},
		{"late output in processing time", func(s *window.Spec[elem, result]) {
			s.Assigner, s.LateOutput = window.TumblingProcessingTime(time.Second), late
		}},
		{"offset of a session", func(s *window.Spec[elem, result]) {
			s.Assigner = window.EventTimeSession(time.Second).WithOffset(time.Millisecond)
		}},
		{"offset of a size", func(s *window.Spec[elem, result]) {
			s.Assigner = window.TumblingEventTime(time.Second).WithOffset(-time.Second)
		}},
		{"offset of a slide", func(s *window.Spec[elem, result]) {
			s.Assigner = window.SlidingEventTime(time.Minute, time.Second).WithOffset(time.Second)
		}},
		{"sub-ms offset", func(s *window.Spec[elem, result]) {
			s.Assigner = window.TumblingEventTime(time.Second).WithOffset(time.Microsecond)
		}},
		{"sessions without merge", func(s *window.Spec[elem, result]) {
			s.Assigner = window.EventTimeSession(time.Second)
			s.Function = window.Aggregate[elem, result, result](kstateAgg{}, kstate.JSON[result]())
		}},
	}
	if _, err := window.Job(ok); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for _, tt := range tests {
		s := ok
		tt.change(&s)
		if _, err := window.Job(s); err == nil {
			t.Errorf("%s: Job accepted it", tt.name)
		} else {
			t.Logf("%s: %v", tt.name, err)
		}
	}
}

// kstateAgg is an AggregateFunc without Merge.
type kstateAgg struct{}

func (kstateAgg) CreateAccumulator() result     { return result{} }
func (kstateAgg) Add(e elem, acc result) result { return sum{}.Add(e, acc) }
func (kstateAgg) Result(acc result) result      { return acc }

// A window whose function fails is dead-lettered as its timer's failure,
// and does not hold up the later windows of its key.
func TestFailingWindowDoesNotBlockItsKey(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	for _, lateness := range []time.Duration{0, 5 * time.Second} {
		t.Run(lateness.String(), func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
				Assigner:        window.TumblingEventTime(10 * time.Second),
				AllowedLateness: lateness,
				Function: window.Process(kstate.JSON[elem](), func(_ sluice.Context, w window.Window, es []elem, emit func(result)) error {
					var r result
					for _, e := range es {
						if e.V == 13 {
							return fmt.Errorf("unlucky window %s", w)
						}
						r = sum{}.Add(e, r)
					}
					emit(r)
					return nil
				}),
			}), sluicetest.Options{})
			send(h, a(1, 13), a(10, 1), a(20, 2), a(30, 0), a(40, 0))
			h.Settle()
			expectInOrder(t, "windows", values(h.Output()),
				line("a", at(10), at(20), result{1, 1}),
				line("a", at(20), at(30), result{1, 2}),
				line("a", at(30), at(40), result{1, 0}),
			)
			dl := h.DeadLetters()
			if len(dl) != 1 || header(dl[0], sluice.HeaderStage) != "timer" || string(dl[0].Key) != "a" {
				t.Fatalf("dead letters: %+v, want the one timer of key a", dl)
			}
		})
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

// The engine stores timers before 1970 as 1970, so windows that end before
// then fire together when the watermark reaches it, and nothing is lost.
func TestBefore1970(t *testing.T) {
	t.Parallel()
	a := func(s, v int64) elem { return elem{Key: "a", T: s * 1000, V: v} }
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.TumblingEventTime(10 * time.Second), Function: functions[0].fn,
	}), sluicetest.Options{})
	send(h, a(-25, 1), a(-21, 2), a(-15, 4), a(-1, 8))
	h.Settle()
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("fired before the watermark reached 1970: %v", values(out))
	}
	send(h, a(0, 16), a(10, 0))
	h.Settle()
	expectInOrder(t, "windows", values(h.Output()),
		line("a", -30000, -20000, result{2, 3}),
		line("a", -20000, -10000, result{1, 4}),
		line("a", -10000, 0, result{1, 8}),
		line("a", 0, 10000, result{1, 16}),
	)
}

// With two partitions each task keeps its own windows and watermark; the
// result is the same as with one.
func TestTwoPartitions(t *testing.T) {
	t.Parallel()
	es := stream(7, 300)
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.EventTimeSession(4500 * time.Millisecond), Function: functions[1].fn,
	}), sluicetest.Options{MaxOutOfOrderness: outOfOrder, Partitions: 2})
	send(h, es...)
	// A flush per partition: event time is per task.
	f := flush(es)
	for i := range 8 {
		f.Key = flushKey + strconv.Itoa(i)
		send(h, f)
	}
	h.Settle()
	expectSorted(t, "windows", withoutFlush(values(h.Output())), batchSessions(es, 4500))
}

// Offsets shift windows from the epoch's multiples: daily windows from
// 08:00 UTC (midnight 8 hours behind UTC) in event time, and minutes from
// 20 s past in processing time. (The batch-model tests run a tumbling and
// a sliding assigner with offsets too.)
func TestWindowOffsets(t *testing.T) {
	t.Parallel()
	t.Run("event time", func(t *testing.T) {
		t.Parallel()
		day := func(s string) int64 {
			tm, err := time.Parse(time.RFC3339, s)
			if err != nil {
				t.Fatal(err)
			}
			return tm.UnixMilli()
		}
		h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
			Assigner: window.TumblingEventTime(24 * time.Hour).WithOffset(8 * time.Hour), Function: functions[0].fn,
		}), sluicetest.Options{})
		send(h,
			elem{Key: "a", T: day("2026-01-01T07:00:00Z"), V: 1}, // 23:00 the day before, there
			elem{Key: "a", T: day("2026-01-01T09:00:00Z"), V: 2},
			elem{Key: "a", T: day("2026-01-03T00:00:00Z"), V: 0},
		)
		h.Settle()
		expectInOrder(t, "windows", values(h.Output()),
			line("a", day("2025-12-31T08:00:00Z"), day("2026-01-01T08:00:00Z"), result{1, 1}),
			line("a", day("2026-01-01T08:00:00Z"), day("2026-01-02T08:00:00Z"), result{1, 2}),
		)
	})
	t.Run("processing time", func(t *testing.T) {
		t.Parallel()
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the harness's default clock
		ms := func(d time.Duration) int64 { return start.Add(d).UnixMilli() }
		h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
			Assigner: window.TumblingProcessingTime(time.Minute).WithOffset(20 * time.Second), Function: functions[0].fn,
		}), sluicetest.Options{})
		send(h, elem{Key: "a", V: 1})
		h.Settle()
		h.Advance(20 * time.Second)
		h.Settle()
		expectInOrder(t, "windows", values(h.Output()), line("a", ms(-40*time.Second), ms(20*time.Second), result{1, 1}))
	})
}
