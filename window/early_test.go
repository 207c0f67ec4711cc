package window_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// Early firings in event time: each time the watermark passes a multiple
// of EarlyInterval while the window holds elements it has not fired with,
// the window fires with its result so far; a window that did not change is
// not fired again; the firing at the end stays.
func TestEarlyIntervalInEventTime(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	steps := []elem{
		a(1, 1), // [0,10) arms its early timer at 2
		a(2, 2), // watermark 2: fires early, 2 elements
		a(3, 3), // the first since: arms 4
		a(3, 4),
		a(7, 5), // watermark 7 passes 4: fires early, 5 elements
		a(7, 6), // arms 8
		// Watermark 12: [0,10) fires early at 8, then at its end with
		// the same 6. [10,20), made by this element, holds an element
		// at 10, a multiple: it fires early there, and its own early
		// timer at 12 finds it unchanged.
		a(12, 7),
		a(13, 8), // arms 14; 13 passes nothing
		a(14, 9), // watermark 14: fires early
		a(14, 1), // arms 16
		a(31, 0), // watermark 31: [10,20) fires early at 16, then at its end
	}
	want := []string{
		line("a", at(0), at(10), result{2, 3}),
		line("a", at(0), at(10), result{5, 15}),
		line("a", at(0), at(10), result{6, 21}),
		line("a", at(0), at(10), result{6, 21}),
		line("a", at(10), at(20), result{1, 7}),
		line("a", at(10), at(20), result{3, 24}),
		line("a", at(10), at(20), result{4, 25}),
		line("a", at(10), at(20), result{4, 25}),
	}
	for _, f := range functions {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
				Assigner: window.TumblingEventTime(10 * time.Second), Function: f.fn, EarlyInterval: 2 * time.Second,
			}), sluicetest.Options{})
			send(h, steps...)
			h.Settle()
			expectInOrder(t, "windows", values(h.Output()), want...)
			expectStampedAtMaxTimestamp(t, h.Output())
		})
	}
}

// A session that absorbs another keeps its early timer even where the
// absorbed session's end timer, which the merge deletes, is at the same
// millisecond.
func TestEarlyIntervalAcrossASessionMerge(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	for _, f := range functions {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
				Assigner: window.EventTimeSession(2 * time.Second), Function: f.fn, EarlyInterval: 2 * time.Second,
			}), sluicetest.Options{})
			send(h,
				elem{Key: "a", T: at(1), V: 1}, // [1,3): arms 2
				elem{Key: "a", T: at(2), V: 2}, // merged [1,4); watermark 2: fires early
				// Merged [1,5) arms 4, the end of the [1,4) it absorbs,
				// whose timer the merge deletes.
				elem{Key: "a", T: at(3), V: 3},
				elem{Key: "b", T: at(10), V: 0}, // watermark 10: [1,5) fires early at 4, then at 5
			)
			h.Settle()
			expectInOrder(t, "windows", values(h.Output()),
				line("a", at(1), at(4), result{2, 3}),
				line("a", at(1), at(5), result{3, 6}),
				line("a", at(1), at(5), result{3, 6}),
			)
		})
	}
}

// In processing time the clock's multiples fire a window early; a window
// that did not change since is not fired again.
func TestEarlyIntervalInProcessingTime(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // the harness's default clock
	ms := func(d time.Duration) int64 { return start.Add(d).UnixMilli() }
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.TumblingProcessingTime(time.Minute), Function: functions[1].fn, EarlyInterval: 20 * time.Second,
	}), sluicetest.Options{})
	for _, s := range []any{
		elem{Key: "a", V: 1}, 20 * time.Second, // arms 20 s, fires early there
		15 * time.Second,     // nothing new: nothing armed
		elem{Key: "a", V: 2}, // at 35 s: arms 40 s
		10 * time.Second,     // fires early
		5 * time.Second,
		elem{Key: "a", V: 3}, // at 50 s: 60 s is the end, not early
		10 * time.Second,     // 60 s: fires at its end, and is cleared
	} {
		switch s := s.(type) {
		case elem:
			send(h, s)
		case time.Duration:
			h.Advance(s)
		}
		h.Settle()
	}
	expectInOrder(t, "windows", values(h.Output()),
		line("a", ms(0), ms(time.Minute), result{1, 1}),
		line("a", ms(0), ms(time.Minute), result{2, 3}),
		line("a", ms(0), ms(time.Minute), result{3, 6}),
	)
	if live := liveWindows(t, h); len(live) != 0 {
		t.Fatalf("windows left in state after their end: %q", live)
	}
}

// liveWindows is the window index's entries (job "w") that the changelog
// holds a value for, as "<key>/<encoded window>".
func liveWindows(t *testing.T, h *sluicetest.Harness) []string {
	t.Helper()
	var out []string
	for _, e := range liveState(t, h) {
		if id, ok := strings.CutPrefix(e, "w.windows "); ok {
			out = append(out, id)
		}
	}
	return out
}

// An early firing that fails emits nothing, is counted and fails nothing
// else: by count, the element that brought the count is kept (so every
// later element is not dead-lettered in turn); by time, another window's
// end firing at the same timer still goes out. At its end the failing
// window's firing is dead-lettered, as any firing's.
func TestEarlyFiringFailuresFailNothingElse(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	poisoned := window.Process(kstate.JSON[elem](), func(_ sluice.Context, _ window.Window, es []elem, emit func(result)) error {
		var r result
		for _, e := range es {
			if e.V == 13 {
				return errors.New("13 is poison")
			}
			r = sum{}.Add(e, r)
		}
		emit(r)
		return nil
	})
	failedCount := func(t *testing.T, c prometheus.Counter) float64 {
		t.Helper()
		var m dto.Metric
		if err := c.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	t.Run("count", func(t *testing.T) {
		t.Parallel()
		failed := prometheus.NewCounter(prometheus.CounterOpts{Name: "early_failed"})
		h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
			Assigner: window.TumblingEventTime(10 * time.Second), Function: poisoned, EarlyCount: 2, EarlyFailed: failed,
		}), sluicetest.Options{})
		send(h, a(1, 13))
		for i := range int64(10) {
			send(h, a(1+i%8, i)) // counts 2 to 11 in [0,10): five early firings fail
		}
		send(h, a(12, 1), a(13, 2), a(30, 0))
		h.Settle()
		expectInOrder(t, "windows", values(h.Output()),
			line("a", at(10), at(20), result{2, 3}),
			line("a", at(10), at(20), result{2, 3}),
		)
		dl := h.DeadLetters()
		if len(dl) != 1 || header(dl[0], sluice.HeaderStage) != "timer" {
			t.Fatalf("dead letters %v, want the poisoned window's end firing alone", dl)
		}
		if n := failedCount(t, failed); n != 5 {
			t.Fatalf("EarlyFailed %v, want 5", n)
		}
	})
	t.Run("interval", func(t *testing.T) {
		t.Parallel()
		failed := prometheus.NewCounter(prometheus.CounterOpts{Name: "early_failed"})
		h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
			Assigner: window.TumblingEventTime(10 * time.Second), Function: poisoned, EarlyInterval: 2 * time.Second, EarlyFailed: failed,
		}), sluicetest.Options{MaxOutOfOrderness: 5 * time.Second})
		send(h,
			a(1, 1),   // [0,10) arms 2
			a(12, 13), // [10,20) arms 12; watermark 7: [0,10) fires early at 2
			// Watermark 11: the timer at 10 ends [0,10) and would fire
			// [10,20) early, which fails.
			a(16, 2),
			a(40, 0), // [10,20) fails early at 12, then at its end
		)
		h.Settle()
		expectInOrder(t, "windows", values(h.Output()),
			line("a", at(0), at(10), result{1, 1}),
			line("a", at(0), at(10), result{1, 1}),
		)
		dl := h.DeadLetters()
		if len(dl) != 1 || header(dl[0], sluice.HeaderStage) != "timer" || header(dl[0], "sluice.timer.at") != strconv.FormatInt(at(20), 10) {
			t.Fatalf("dead letters %v, want [10,20)'s end firing alone", dl)
		}
		if n := failedCount(t, failed); n != 2 {
			t.Fatalf("EarlyFailed %v, want 2 (at 10 and 12)", n)
		}
	})
}

// A late element (within the lateness) that brings a fired window's count
// to a multiple fires it once, as a late firing, not a second time by
// count.
func TestEarlyCountAndLateElements(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	a := func(s, v int64) elem { return elem{Key: "a", T: at(s), V: v} }
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.TumblingEventTime(10 * time.Second), Function: functions[0].fn, EarlyCount: 2, AllowedLateness: 5 * time.Second,
	}), sluicetest.Options{})
	send(h,
		a(1, 1), a(2, 2), // count 2: fires early
		a(3, 3),
		a(10, 4), // watermark 10: [0,10) fires at its end
		a(5, 5),  // late, count 4: the late firing only
		a(30, 0), // [10,20) fires, and [0,10) is cleared
	)
	h.Settle()
	expectInOrder(t, "windows", values(h.Output()),
		line("a", at(0), at(10), result{2, 3}),
		line("a", at(0), at(10), result{3, 6}),
		line("a", at(0), at(10), result{4, 11}),
		line("a", at(10), at(20), result{1, 4}),
	)
	if live := liveWindows(t, h); len(live) != 1 {
		t.Fatalf("windows in state %q, want [30,40) alone", live)
	}
}

// EarlyCount fires a window each time its count reaches a multiple, right
// after that element, and the window still fires at its end: on an
// out-of-order stream, each window's results are exactly its running
// results at 2, 4, 6… elements in the order they came, then its whole
// result; across a kill -9 mid-stream.
func TestEarlyCountMatchesRunningResults(t *testing.T) {
	t.Parallel()
	for i, a := range assigners[:3] { // sessions merge counts: below
		for _, f := range functions {
			t.Run(a.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				es := stream(uint64(i+40), 300)
				want := map[string][]string{}
				running := map[string]result{}
				for _, e := range es {
					for _, w := range fixedWindows(a.name, e.T) {
						id := line(e.Key, w[0], w[1], result{})
						r := sum{}.Add(e, running[id])
						running[id] = r
						if r.N%2 == 0 {
							want[id] = append(want[id], line(e.Key, w[0], w[1], r))
						}
					}
				}
				for id, r := range running {
					var key string
					var start, end int64
					fmt.Sscanf(id, "%s [%d,%d)", &key, &start, &end)
					want[id] = append(want[id], line(key, start, end, r))
				}
				h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{Assigner: a.assigner, Function: f.fn, EarlyCount: 2}),
					sluicetest.Options{MaxOutOfOrderness: outOfOrder})
				sendWithKill(h, es)
				send(h, flush(es))
				h.Settle()
				got := byWindow(withoutFlush(values(h.Output())))
				if len(got) != len(want) {
					t.Fatalf("%d windows fired, want %d", len(got), len(want))
				}
				early := 0
				for id, w := range want {
					if !slices.Equal(got[id], w) {
						t.Fatalf("window %s: results\n%q\nwant\n%q", id, got[id], w)
					}
					early += len(w) - 1
				}
				if early < 50 {
					t.Fatalf("%d early firings: too few to test anything", early)
				}
			})
		}
	}
}

// On an out-of-order stream, with early firings by time and by count, a
// kill -9 mid-stream changes no result: the outputs equal those of the
// same stream without a kill, window by window in order, for every window
// kind (sessions merging) and function; and the last result of each window
// of the batch computation is that computation's.
func TestEarlyFiringsSurviveAKill(t *testing.T) {
	t.Parallel()
	for i, a := range assigners {
		for _, f := range functions {
			t.Run(a.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				es := stream(uint64(i+60), 300)
				spec := window.Spec[elem, result]{Assigner: a.assigner, Function: f.fn, EarlyInterval: 2 * time.Second, EarlyCount: 4}
				run := func(kill bool, backend string) map[string][]string {
					h := sluicetest.New(t, mustJob(t, spec), sluicetest.Options{MaxOutOfOrderness: outOfOrder, Backend: backend})
					if kill {
						sendWithKill(h, es)
					} else {
						send(h, es...)
					}
					send(h, flush(es))
					h.Settle()
					if dl := h.DeadLetters(); len(dl) > 0 {
						t.Fatalf("dead letters: %v", values(dl))
					}
					return byWindow(withoutFlush(values(h.Output())))
				}
				want, got := run(false, "memory"), run(true, "bbolt")
				early := 0
				for id, w := range want {
					if !slices.Equal(got[id], w) {
						t.Fatalf("window %s: results across a kill\n%q\nwant, as without one,\n%q", id, got[id], w)
					}
					early += len(w) - 1
				}
				if len(got) != len(want) {
					t.Fatalf("%d windows across a kill, %d without", len(got), len(want))
				}
				if early < 50 {
					t.Fatalf("%d early firings: too few to test anything", early)
				}
				// Each window's last result is the batch computation's.
				// A session that merged into another before its end
				// fired early under its old bounds only: those are
				// windows the batch does not have.
				batch := withoutFlush(a.batch(es))
				for _, b := range batch {
					w := byWindow([]string{b})
					for id := range w {
						if rs := want[id]; len(rs) == 0 || rs[len(rs)-1] != b {
							t.Fatalf("window %s: results %q, want the last to be the batch's %q", id, rs, b)
						}
					}
				}
				if extra := len(want) - len(batch); extra != 0 && a.name != "session" {
					t.Fatalf("%d windows the batch does not have", extra)
				}
			})
		}
	}
}

func TestEarlyFiringSpecIsChecked(t *testing.T) {
	ok := window.Spec[elem, result]{Name: "w", Assigner: window.TumblingEventTime(time.Second), Function: functions[0].fn,
		Decode: decode, Encode: encode, Timestamp: timestamp, EarlyInterval: 100 * time.Millisecond, EarlyCount: 10}
	if _, err := window.Job(ok); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for name, change := range map[string]func(s *window.Spec[elem, result]){
		"negative interval": func(s *window.Spec[elem, result]) { s.EarlyInterval = -time.Second },
		"sub-ms interval":   func(s *window.Spec[elem, result]) { s.EarlyInterval = 1500 * time.Microsecond },
		"negative count":    func(s *window.Spec[elem, result]) { s.EarlyCount = -1 },
	} {
		s := ok
		change(&s)
		if _, err := window.Job(s); err == nil {
			t.Errorf("%s: Job accepted it", name)
		}
	}
}

// fixedWindows is the windows [start, end) of the assigner named that hold
// t (ms): the first three of assigners.
func fixedWindows(name string, t int64) [][2]int64 {
	size, slide := int64(10000), map[string]int64{"tumbling": 10000, "sliding": 5000, "sliding-uneven": 3000}[name]
	var out [][2]int64
	for start := t - t%slide; start > t-size; start -= slide {
		out = append(out, [2]int64{start, start + size})
	}
	return out
}

// byWindow groups results by their window, in the order they came.
func byWindow(lines []string) map[string][]string {
	m := map[string][]string{}
	for _, l := range lines {
		var key string
		var start, end int64
		fmt.Sscanf(l, "%s [%d,%d)", &key, &start, &end)
		id := line(key, start, end, result{})
		m[id] = append(m[id], l)
	}
	return m
}

// sendWithKill sends es with a kill -9 and a restart after two thirds,
// the first third settled (committed) before.
func sendWithKill(h *sluicetest.Harness, es []elem) {
	third := len(es) / 3
	send(h, es[:third]...)
	h.Settle()
	send(h, es[third:2*third]...)
	h.Kill()
	h.Restart()
	send(h, es[2*third:]...)
}

// Early firings by count and by time share what was fired: an interval
// timer after a count firing, with nothing new, fires nothing. And a
// failed early firing does not end a window's early firings: the next
// element arms the next one.
func TestEarlyFiringsTakeTurns(t *testing.T) {
	t.Parallel()
	at := func(s int64) int64 { return base + s*1000 }
	onlyA := func(lines []string) []string {
		return slices.DeleteFunc(lines, func(l string) bool { return l[0] != 'a' })
	}
	t.Run("count then interval", func(t *testing.T) {
		t.Parallel()
		h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
			Assigner: window.TumblingEventTime(10 * time.Second), Function: functions[0].fn, EarlyInterval: 2 * time.Second, EarlyCount: 2,
		}), sluicetest.Options{})
		send(h,
			elem{Key: "a", T: at(1), V: 1}, // arms 2
			elem{Key: "a", T: at(1), V: 2}, // count 2: fires early
			elem{Key: "b", T: at(3), V: 0}, // watermark 3: a's timer at 2 finds it unchanged
			elem{Key: "b", T: at(30), V: 0},
		)
		h.Settle()
		expectInOrder(t, "a's windows", onlyA(values(h.Output())),
			line("a", at(0), at(10), result{2, 3}),
			line("a", at(0), at(10), result{2, 3}),
		)
	})
	t.Run("after a failure", func(t *testing.T) {
		t.Parallel()
		// Fails on a window of exactly two elements.
		fn := window.Process(kstate.JSON[elem](), func(_ sluice.Context, _ window.Window, es []elem, emit func(result)) error {
			if len(es) == 2 {
				return errors.New("two")
			}
			var r result
			for _, e := range es {
				r = sum{}.Add(e, r)
			}
			emit(r)
			return nil
		})
		h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
			Assigner: window.TumblingEventTime(10 * time.Second), Function: fn, EarlyInterval: 2 * time.Second,
		}), sluicetest.Options{})
		send(h,
			elem{Key: "a", T: at(1), V: 1}, // arms 2
			elem{Key: "a", T: at(1), V: 2},
			elem{Key: "b", T: at(3), V: 0}, // watermark 3: a fails early at 2
			elem{Key: "a", T: at(3), V: 3}, // arms 4
			elem{Key: "b", T: at(5), V: 0}, // watermark 5: a fires early at 4
			elem{Key: "b", T: at(30), V: 0},
		)
		h.Settle()
		expectInOrder(t, "a's windows", onlyA(values(h.Output())),
			line("a", at(0), at(10), result{3, 6}),
			line("a", at(0), at(10), result{3, 6}),
		)
	})
}
