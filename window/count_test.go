package window_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// countJob is a window job of count windows over the tests' elements: no
// Timestamp (count windows keep no clock), results as line.
func countJob(t *testing.T, a window.Assigner, fn window.Function[elem, result]) sluice.Job {
	t.Helper()
	job, err := window.Job(window.Spec[elem, result]{Name: "w", Assigner: a, Function: fn, Decode: decode, Encode: encode})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// sendAt sends each element with its T as the record's Kafka time, which
// is what a count window's Window spans.
func sendAt(h *sluicetest.Harness, es ...elem) {
	for _, e := range es {
		h.Send([]byte(e.Key), e.value(), time.UnixMilli(e.T))
	}
}

// modelCounts is Flink's countWindow(size, slide) per key: every slide
// records of a key, a result over its last size records (fewer at first),
// the window spanning their Kafka times. Results per key, in order.
func modelCounts(es []elem, size, slide int) map[string][]string {
	byKey := map[string][]elem{}
	out := map[string][]string{}
	for _, e := range es {
		ks := append(byKey[e.Key], e)
		byKey[e.Key] = ks
		if len(ks)%slide != 0 {
			continue
		}
		in := ks[max(0, len(ks)-size):]
		var r result
		lo, hi := in[0].T, in[0].T
		for _, x := range in {
			r = sum{}.Add(x, r)
			lo, hi = min(lo, x.T), max(hi, x.T)
		}
		out[e.Key] = append(out[e.Key], line(e.Key, lo, hi+1, r))
	}
	return out
}

// byKeyInOrder groups result lines by their key, keeping their order.
func byKeyInOrder(lines []string) map[string][]string {
	out := map[string][]string{}
	for _, l := range lines {
		k, _, _ := strings.Cut(l, " ")
		out[k] = append(out[k], l)
	}
	return out
}

// countStream is n elements over four keys whose Kafka times wander back
// and forth (count windows do not care), values random.
func countStream(seed uint64, n int) []elem {
	rng := rand.New(rand.NewPCG(seed, seed^0xc0417))
	es := make([]elem, n)
	for i := range es {
		es[i] = elem{Key: "k" + strconv.Itoa(rng.IntN(4)), T: base + int64(rng.IntN(60))*1000, V: int64(rng.IntN(100))}
	}
	return es
}

// Count windows give Flink's countWindow results, per key and in order,
// for every function, tumbling and sliding (overlapping, and with slide
// past size), on both backends, across a kill that replays an epoch; a
// key's results carry the latest Kafka time among its window's records.
func TestCountWindowsMatchModel(t *testing.T) {
	t.Parallel()
	kinds := []struct {
		name        string
		size, slide int
		assigner    window.Assigner
	}{
		{"tumbling-3", 3, 3, window.TumblingCount(3)},
		{"tumbling-1", 1, 1, window.TumblingCount(1)},
		{"sliding-5-2", 5, 2, window.SlidingCount(5, 2)},
		{"sliding-3-1", 3, 1, window.SlidingCount(3, 1)},
		{"sliding-2-5", 2, 5, window.SlidingCount(2, 5)},
		{"sliding-4-4", 4, 4, window.SlidingCount(4, 4)},
	}
	for i, k := range kinds {
		for _, f := range functions {
			for _, backend := range []string{"bbolt", "memory"} {
				t.Run(k.name+"/"+f.name+"/"+backend, func(t *testing.T) {
					t.Parallel()
					es := countStream(uint64(7+i), 240)
					h := sluicetest.New(t, countJob(t, k.assigner, f.fn), sluicetest.Options{Backend: backend})
					third := len(es) / 3
					sendAt(h, es[:third]...)
					h.Settle()
					sendAt(h, es[third:2*third]...) // some of it committed, some not
					h.Kill()
					h.Restart()
					sendAt(h, es[2*third:]...)
					h.Settle()
					got, want := byKeyInOrder(values(h.Output())), modelCounts(es, k.size, k.slide)
					for key, w := range want {
						expectInOrder(t, key, got[key], w...)
					}
					if len(got) != len(want) {
						t.Fatalf("results for keys %v, want %v", slices.Sorted(maps(got)), slices.Sorted(maps(want)))
					}
					expectStampedAtMaxTimestamp(t, h.Output())
					if dl := h.DeadLetters(); len(dl) > 0 {
						t.Fatalf("%d dead letters, first %q", len(dl), dl[0].Value)
					}
				})
			}
		}
	}
}

func maps(m map[string][]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// liveState lists the job's state entries that the changelog holds a
// value for last: what the keys keep.
func liveState(t *testing.T, h *sluicetest.Harness) []string {
	t.Helper()
	live := map[string]bool{}
	for _, r := range h.Records(sluicetest.AppID + "-changelog") {
		k, err := kstate.DecodeKey(r.Key)
		if err != nil || !strings.HasPrefix(k.Name, "w.") {
			continue // markers and the engine's own state
		}
		live[fmt.Sprintf("%s %s/%x", k.Name, k.UserKey, k.Sub)] = r.Value != nil
	}
	var out []string
	for id, ok := range live {
		if ok {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// A key of tumbling count windows keeps nothing once its window fires,
// and one of sliding windows that do not overlap likewise; overlapping
// ones keep their last size-1 records' windows and the count. Process
// keeps each element in a state entry of its own until its window fires.
func TestCountWindowsLeaveNoState(t *testing.T) {
	t.Parallel()
	a := func(v int64) elem { return elem{Key: "a", T: base + v, V: v} }
	for _, f := range functions[:2] {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			h := sluicetest.New(t, countJob(t, window.TumblingCount(2), f.fn), sluicetest.Options{})
			sendAt(h, a(1), a(2), a(3))
			h.Settle()
			want := []string{"w.count a/", "w.windows a/" + fmt.Sprintf("%x", spanKey(0, 2))}
			if f.name == "process" {
				want = append(want, elementState(1))
			}
			slices.Sort(want)
			expectInOrder(t, "state with one record in the window", liveState(t, h), want...)
			sendAt(h, a(4))
			h.Settle()
			expectInOrder(t, "state after the window fired", liveState(t, h))
			expectInOrder(t, "results", values(h.Output()),
				line("a", base+1, base+3, result{2, 3}), line("a", base+3, base+5, result{2, 7}))

			h = sluicetest.New(t, countJob(t, window.SlidingCount(2, 3), f.fn), sluicetest.Options{})
			sendAt(h, a(1), a(2), a(3))
			h.Settle()
			expectInOrder(t, "sliding 2, 3: state after a firing", liveState(t, h))
			expectInOrder(t, "sliding 2, 3: results", values(h.Output()), line("a", base+2, base+4, result{2, 5}))

			// Overlapping: after 5 records of SlidingCount(3, 1) the windows
			// that fire with records 6 and 7 are open, and Process keeps
			// records 4 and 5, each once.
			h = sluicetest.New(t, countJob(t, window.SlidingCount(3, 1), f.fn), sluicetest.Options{})
			sendAt(h, a(1), a(2), a(3), a(4), a(5))
			h.Settle()
			want = []string{"w.count a/", "w.windows a/" + fmt.Sprintf("%x", spanKey(3, 6)), "w.windows a/" + fmt.Sprintf("%x", spanKey(4, 7))}
			if f.name == "process" {
				want = append(want, elementState(4), elementState(5))
			}
			slices.Sort(want)
			expectInOrder(t, "sliding 3, 1: state after 5 records", liveState(t, h), want...)

			// Windows apart (slide 5 > size 1): only records 5 and 10 are
			// in one, and a Process function's changelog names no other
			// element. (Found by review: each firing also wrote a
			// tombstone for each of the slide-size numbers after it.)
			h = sluicetest.New(t, countJob(t, window.SlidingCount(1, 5), f.fn), sluicetest.Options{})
			for v := range int64(10) {
				sendAt(h, a(v+1))
			}
			h.Settle()
			for _, r := range h.Records(sluicetest.AppID + "-changelog") {
				if k, err := kstate.DecodeKey(r.Key); err == nil && k.Name == "w.elements" {
					if n := binary.BigEndian.Uint64(k.Sub[len(k.Sub)-8:]); n != 5 && n != 10 {
						t.Fatalf("sliding 1, 5: the changelog has element %d, in no window", n)
					}
				}
			}
		})
	}
}

// elementState is liveState's name for a count window's element n: the
// key's one slot, then n.
func elementState(n int64) string {
	return "w.elements a/" + fmt.Sprintf("%x", binary.BigEndian.AppendUint64(spanKey(0, 0), uint64(n)))
}

// spanKey is a count window's key in the window index: [from, to) in
// record numbers, encoded as the package encodes spans (sign bit flipped,
// big-endian).
func spanKey(from, to int64) []byte {
	b := make([]byte, 0, 16)
	for _, v := range []int64{from, to} {
		u := uint64(v) ^ 1<<63
		b = append(b, byte(u>>56), byte(u>>48), byte(u>>40), byte(u>>32), byte(u>>24), byte(u>>16), byte(u>>8), byte(u))
	}
	return b
}

// A window function that fails when a record completes a count window
// fails that record: it is dead-lettered, and the window, which it did
// not complete, fires with the key's next record. (A failure that comes
// from the window's other elements fails each next record too:
// docs/windows.md, count windows.)
func TestCountWindowFailureFailsTheRecord(t *testing.T) {
	t.Parallel()
	a := func(v int64) elem { return elem{Key: "a", T: base + v, V: v} }
	fn := window.Process(kstate.JSON[elem](), func(_ sluice.Context, _ window.Window, es []elem, emit func(result)) error {
		var r result
		for _, e := range es {
			r = sum{}.Add(e, r)
		}
		if es[len(es)-1].V == 13 {
			return errors.New("unlucky")
		}
		emit(r)
		return nil
	})
	h := sluicetest.New(t, countJob(t, window.TumblingCount(2), fn), sluicetest.Options{})
	sendAt(h, a(1), a(13), a(2), a(3), a(4))
	h.Settle()
	expectInOrder(t, "results", values(h.Output()),
		line("a", base+1, base+3, result{2, 3}), line("a", base+3, base+5, result{2, 7}))
	dl := h.DeadLetters()
	if len(dl) != 1 || string(dl[0].Value) != string(a(13).value()) || !strings.Contains(header(dl[0], sluice.HeaderError), "unlucky") {
		t.Fatalf("dead letters %+v, want the record of 13 with the function's error", dl)
	}
}

// Count windows refuse what is about time.
func TestCountSpecIsChecked(t *testing.T) {
	t.Parallel()
	ok := window.Spec[elem, result]{Name: "w", Assigner: window.SlidingCount(3, 1), Function: functions[0].fn, Decode: decode, Encode: encode}
	if _, err := window.Job(ok); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	tests := []struct {
		name   string
		change func(*window.Spec[elem, result])
	}{
		{"zero size", func(s *window.Spec[elem, result]) { s.Assigner = window.TumblingCount(0) }},
		{"negative size", func(s *window.Spec[elem, result]) { s.Assigner = window.SlidingCount(-1, 1) }},
		{"zero slide", func(s *window.Spec[elem, result]) { s.Assigner = window.SlidingCount(3, 0) }},
		{"offset", func(s *window.Spec[elem, result]) { s.Assigner = window.TumblingCount(3).WithOffset(time.Millisecond) }},
		{"timestamp", func(s *window.Spec[elem, result]) { s.Timestamp = timestamp }},
		{"lateness", func(s *window.Spec[elem, result]) { s.AllowedLateness = time.Second }},
		{"late output", func(s *window.Spec[elem, result]) { s.LateOutput = late }},
		{"early interval", func(s *window.Spec[elem, result]) { s.EarlyInterval = time.Second }},
		{"early count", func(s *window.Spec[elem, result]) { s.EarlyCount = 2 }},
		{"late dropped", func(s *window.Spec[elem, result]) {
			s.LateDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
		}},
		{"early failed", func(s *window.Spec[elem, result]) {
			s.EarlyFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
		}},
		{"size past the bound", func(s *window.Spec[elem, result]) { s.Assigner = window.TumblingCount(1<<31 + 1) }},
		{"slide past the bound", func(s *window.Spec[elem, result]) { s.Assigner = window.SlidingCount(2, 1<<31+1) }},
		{"no decode", func(s *window.Spec[elem, result]) { s.Decode = nil }},
		{"no encode", func(s *window.Spec[elem, result]) { s.Encode = nil }},
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
