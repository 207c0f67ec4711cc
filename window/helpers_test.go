package window_test

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// The tests' records: key = the element's key, value = "t,v" with t the
// event time in unix milliseconds.
type elem struct {
	Key string
	T   int64
	V   int64
}

func (e elem) value() []byte { return fmt.Appendf(nil, "%d,%d", e.T, e.V) }

func decode(rec *sluice.Record) (elem, error) {
	ts, vs, ok := strings.Cut(string(rec.Value), ",")
	t, err1 := strconv.ParseInt(ts, 10, 64)
	v, err2 := strconv.ParseInt(vs, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return elem{}, &sluice.DecodeError{Err: fmt.Errorf("value %q: want t,v", rec.Value)}
	}
	return elem{Key: string(rec.Key), T: t, V: v}, nil
}

func timestamp(rec *sluice.Record) (time.Time, error) {
	e, err := decode(rec)
	return time.UnixMilli(e.T), err
}

// result is what every test window computes: count and sum.
type result struct {
	N   int64 `json:"n"`
	Sum int64 `json:"sum"`
}

// sum is the incremental form (an AggregateFunc with Merge).
type sum struct{}

func (sum) CreateAccumulator() result     { return result{} }
func (sum) Add(e elem, acc result) result { return result{acc.N + 1, acc.Sum + e.V} }
func (sum) Result(acc result) result      { return acc }
func (sum) Merge(a, b result) result      { return result{a.N + b.N, a.Sum + b.Sum} }
func encode(key []byte, w window.Window, r result) ([]byte, error) {
	return []byte(line(string(key), w.Start.UnixMilli(), w.End.UnixMilli(), r)), nil
}

func line(key string, start, end int64, r result) string {
	return fmt.Sprintf("%s [%d,%d) n=%d sum=%d", key, start, end, r.N, r.Sum)
}

// functions are the ways of computing result: incremental with an
// accumulator, full-window, and aggregate plus a window function.
var functions = []struct {
	name string
	fn   window.Function[elem, result]
}{
	{"aggregate", window.Aggregate[elem, result, result](sum{}, kstate.JSON[result]())},
	{"process", window.Process(kstate.JSON[elem](), func(_ sluice.Context, _ window.Window, es []elem, emit func(result)) error {
		var r result
		for _, e := range es {
			r = sum{}.Add(e, r)
		}
		emit(r)
		return nil
	})},
	{"aggregate-with", window.AggregateWith(sum{}, kstate.JSON[result](), func(_ sluice.Context, w window.Window, r result, emit func(result)) error {
		if w.End.Sub(w.Start) <= 0 {
			return fmt.Errorf("empty window %s", w)
		}
		emit(r)
		return nil
	})},
}

func mustJob(t *testing.T, s window.Spec[elem, result]) sluice.Job {
	t.Helper()
	if s.Name == "" {
		s.Name = "w"
	}
	s.Decode, s.Encode, s.Timestamp = decode, encode, timestamp
	job, err := window.Job(s)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func send(h *sluicetest.Harness, es ...elem) {
	for _, e := range es {
		h.Send([]byte(e.Key), e.value(), time.Time{})
	}
}

func values(recs []sluice.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

// expectStampedAtMaxTimestamp checks that each result carries its window's
// last millisecond (Window.MaxTimestamp) as its Kafka timestamp, as Flink
// stamps window results: its value, from line, names the window.
func expectStampedAtMaxTimestamp(t *testing.T, recs []sluice.Record) {
	t.Helper()
	for _, r := range recs {
		var key string
		var start, end int64
		if _, err := fmt.Sscanf(string(r.Value), "%s [%d,%d)", &key, &start, &end); err != nil {
			t.Fatalf("result %q: %v", r.Value, err)
		}
		if got := r.Timestamp.UnixMilli(); got != end-1 {
			t.Fatalf("result %q stamped %d, want its window's MaxTimestamp %d", r.Value, got, end-1)
		}
	}
}

func expectSorted(t *testing.T, what string, got, want []string) {
	t.Helper()
	got, want = slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("%s: got %d\n%s\nwant %d\n%s", what, len(got), strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
}

func expectInOrder(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: got\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

const (
	base = int64(1_700_000_000_000) // ms, a multiple of every window size used
	// outOfOrder bounds how far behind the largest time seen a generated
	// element may be: with it as the watermark's out-of-orderness, none
	// is late.
	outOfOrder = 3 * time.Second
	flushKey   = "~flush"
)

// stream is a deterministic out-of-order stream over four keys: times
// advance by 0 to 2 s, each element up to outOfOrder behind the front, all
// on whole seconds (so no element lands exactly on a session's end).
func stream(seed uint64, n int) []elem {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b9))
	front := base
	es := make([]elem, n)
	for i := range es {
		front += int64(rng.IntN(3)) * 1000
		es[i] = elem{
			Key: "k" + strconv.Itoa(rng.IntN(4)),
			T:   front - int64(rng.IntN(int(outOfOrder/time.Second)+1))*1000,
			V:   int64(rng.IntN(100)),
		}
	}
	return es
}

// flush is an element far enough ahead to move the watermark past every
// window of es; its own window is left out of the expectations.
func flush(es []elem) elem {
	end := slices.MaxFunc(es, func(a, b elem) int { return cmp.Compare(a.T, b.T) }).T
	return elem{Key: flushKey, T: end + int64(time.Hour/time.Millisecond), V: 0}
}

// The batch recomputations: each window's result from all its elements.

func batchFixed(es []elem, size, slide, offset int64) []string {
	type win struct {
		key        string
		start, end int64
	}
	acc := map[win]result{}
	for _, e := range es {
		for start := e.T - ((e.T-offset)%slide+slide)%slide; start > e.T-size; start -= slide {
			w := win{e.Key, start, start + size}
			acc[w] = sum{}.Add(e, acc[w])
		}
	}
	var out []string
	for w, r := range acc {
		out = append(out, line(w.key, w.start, w.end, r))
	}
	return out
}

func batchSessions(es []elem, gap int64) []string {
	return batchSessionsBy(es, func(elem) int64 { return gap })
}

// batchSessionsBy is sessions whose gap each element gives (ms): each
// element's window [t, t+gap(e)), and the windows of a key that overlap or
// touch, transitively, one session.
func batchSessionsBy(es []elem, gap func(elem) int64) []string {
	byKey := map[string][]elem{}
	for _, e := range es {
		byKey[e.Key] = append(byKey[e.Key], e)
	}
	var out []string
	for key, ks := range byKey {
		slices.SortStableFunc(ks, func(a, b elem) int { return cmp.Compare(a.T, b.T) })
		start, end, r := ks[0].T, ks[0].T+gap(ks[0]), result{}
		for _, e := range ks {
			if e.T > end { // [e.T, e.T+gap) does not touch the session
				out = append(out, line(key, start, end, r))
				start, r = e.T, result{}
			}
			end = max(end, e.T+gap(e))
			r = sum{}.Add(e, r)
		}
		out = append(out, line(key, start, end, r))
	}
	return out
}

func withoutFlush(lines []string) []string {
	return slices.DeleteFunc(lines, func(s string) bool { return strings.HasPrefix(s, flushKey) })
}
