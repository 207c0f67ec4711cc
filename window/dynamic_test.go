package window_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// gapOf is the tests' dynamic session gap: 1.5, 2.5 or 3.5 s by the
// element's value. The stream's times are whole seconds, so no record's
// window ever just touches a session that has fired.
func gapOf(e elem) time.Duration { return 1500*time.Millisecond + time.Duration(e.V%3)*time.Second }

// batchDynamicSessions is Flink's sessions with a dynamic gap over the
// whole stream, gapOf each element's.
func batchDynamicSessions(es []elem) []string {
	return batchSessionsBy(es, func(e elem) int64 { return gapOf(e).Milliseconds() })
}

// Sessions whose gap each element gives match the batch computation, for
// every function, across a kill that replays an epoch, on both backends.
func TestDynamicSessionsMatchBatch(t *testing.T) {
	t.Parallel()
	for _, f := range functions {
		for _, backend := range []string{"bbolt", "memory"} {
			t.Run(f.name+"/"+backend, func(t *testing.T) {
				t.Parallel()
				es := stream(11, 300)
				h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
					Assigner: window.DynamicEventTimeSession(), SessionGap: gapOf, Function: f.fn,
				}), sluicetest.Options{MaxOutOfOrderness: outOfOrder, Backend: backend})
				sendWithKill(h, es)
				send(h, flush(es))
				h.Settle()
				want := batchDynamicSessions(es)
				if fixed := batchSessions(es, 2500); slices.Equal(slices.Sorted(slices.Values(fixed)), slices.Sorted(slices.Values(want))) {
					t.Fatal("the gaps make no difference to the sessions: the test shows nothing")
				}
				expectSorted(t, "sessions", withoutFlush(values(h.Output())), want)
				expectStampedAtMaxTimestamp(t, withoutFlushRecords(h.Output()))
				if dl := h.DeadLetters(); len(dl) > 0 {
					t.Fatalf("dead letters: %v", values(dl))
				}
			})
		}
	}
}

func withoutFlushRecords(recs []sluice.Record) []sluice.Record {
	return slices.DeleteFunc(recs, func(r sluice.Record) bool { return strings.HasPrefix(string(r.Value), flushKey) })
}

// In processing time each record's window is [now, now+gap): a short gap
// closes its session before a long one that started earlier.
func TestDynamicSessionsInProcessingTime(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.DynamicProcessingTimeSession(), Function: functions[0].fn,
		SessionGap: func(e elem) time.Duration { return time.Duration(e.V) * time.Second },
	}), sluicetest.Options{})
	t0 := h.Now().UnixMilli()
	send(h, elem{Key: "long", V: 10}, elem{Key: "short", V: 2})
	h.Settle()
	h.Advance(2 * time.Second)
	h.Settle()
	expectInOrder(t, "after 2 s", values(h.Output()), line("short", t0, t0+2000, result{1, 2}))
	send(h, elem{Key: "long", V: 1}) // at t0+2s, inside the long session: [t0+2s, t0+3s) changes nothing
	h.Settle()                       // processed at t0+2s, before the clock moves on
	h.Advance(8 * time.Second)
	h.Settle()
	expectInOrder(t, "after 10 s", values(h.Output()),
		line("short", t0, t0+2000, result{1, 2}), line("long", t0, t0+10000, result{2, 11}))
}

// A gap below 1ms fails the record, which touches no session.
func TestDynamicSessionGapBelowAMillisecond(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
		Assigner: window.DynamicEventTimeSession(), Function: functions[0].fn,
		SessionGap: func(e elem) time.Duration { return time.Duration(e.V) * time.Millisecond },
	}), sluicetest.Options{})
	send(h, elem{Key: "a", T: base, V: 0}, elem{Key: "a", T: base + 1, V: 5}, elem{Key: "z", T: base + 10_000, V: 1})
	h.Settle()
	expectInOrder(t, "sessions", values(h.Output()), line("a", base+1, base+6, result{1, 5}))
	dl := h.DeadLetters()
	if len(dl) != 1 || !strings.Contains(header(dl[0], sluice.HeaderError), "SessionGap gave 0s") {
		t.Fatalf("dead letters %+v, want the record whose gap is 0", dl)
	}
}

// Dynamic sessions need SessionGap, and SessionGap needs them.
func TestDynamicSessionSpecIsChecked(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]window.Spec[elem, result]{
		"dynamic without SessionGap":  {Assigner: window.DynamicEventTimeSession()},
		"SessionGap of a fixed gap":   {Assigner: window.EventTimeSession(time.Second), SessionGap: gapOf},
		"SessionGap of tumbling":      {Assigner: window.TumblingEventTime(time.Second), SessionGap: gapOf},
		"SessionGap of count windows": {Assigner: window.TumblingCount(2), SessionGap: gapOf},
		"offset of dynamic sessions":  {Assigner: window.DynamicEventTimeSession().WithOffset(time.Second), SessionGap: gapOf},
	} {
		s.Name, s.Function, s.Decode, s.Encode = "w", functions[0].fn, decode, encode
		if !s.Assigner.Count() {
			s.Timestamp = timestamp
		}
		if _, err := window.Job(s); err == nil {
			t.Errorf("%s: Job accepted it", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
