package join_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/join"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at is base plus ms milliseconds.
func at(ms int64) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }

// pairJob joins "left" and "right" within [lower, upper] and emits
// "<left value>|<right value>".
func pairJob(t *testing.T, lower, upper time.Duration, dropped prometheus.Counter, late sluice.OutputTag) sluice.Job {
	t.Helper()
	job, err := join.Interval(join.IntervalSpec{
		Name: "ij", Left: "left", Right: "right", Lower: lower, Upper: upper,
		Timestamp:   sluice.KafkaTime,
		LateDropped: dropped,
		LateOutput:  late,
		Join: func(key []byte, l, r join.Element) ([]byte, error) {
			if string(l.Value) == "bad" {
				return nil, errors.New("cannot join bad")
			}
			return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func options(partitions int32, backend string, ooo time.Duration) sluicetest.Options {
	return sluicetest.Options{Partitions: partitions, Backend: backend, MaxOutOfOrderness: ooo,
		InputTopics: []string{"left", "right"}}
}

// event is one record of the model test.
type event struct {
	topic, key, value string
	ts                int64 // ms after base
}

// joined is every output as "key:value", sorted.
func joined(out []sluice.Record) []string {
	var got []string
	for _, r := range out {
		got = append(got, string(r.Key)+":"+string(r.Value))
	}
	slices.Sort(got)
	return got
}

// joinedAt is every output as "key:value@ms", ms its timestamp after base,
// sorted.
func joinedAt(out []sluice.Record) []string {
	var got []string
	for _, r := range out {
		got = append(got, fmt.Sprintf("%s:%s@%d", r.Key, r.Value, r.Timestamp.Sub(base).Milliseconds()))
	}
	slices.Sort(got)
	return got
}

// The join's outputs are exactly the pairs of a brute-force model: every
// left and right record of one key whose times are within the bounds, each
// pair once and stamped with the later of its two times, across a kill -9
// mid-stream, on both backends. The records
// come out of order by up to 70 ms; with the watermark 100 ms behind, none
// is late, which the test checks too (nothing dropped).
func TestIntervalJoinMatchesModel(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"bbolt", "memory"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			const lower, upper = -30, 50 // ms
			events := events(4, 400)
			var want []string
			for _, l := range events {
				for _, r := range events {
					if l.topic == "left" && r.topic == "right" && l.key == r.key && r.ts-l.ts >= lower && r.ts-l.ts <= upper {
						// Stamped with the later time of the two.
						want = append(want, fmt.Sprintf("%s:%s|%s@%d", l.key, l.value, r.value, max(l.ts, r.ts)))
					}
				}
			}
			slices.Sort(want)
			if len(want) < 100 {
				t.Fatalf("the model has %d pairs: too few to test anything", len(want))
			}

			dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "late records dropped"})
			job := pairJob(t, lower*time.Millisecond, upper*time.Millisecond, dropped, "")
			h := sluicetest.New(t, job, options(2, backend, 100*time.Millisecond))
			sendWithAKill(h, events)
			h.Settle()
			expectModel(t, h, joinedAt(h.Output()), want)
			if n := value(t, dropped); n != 0 {
				t.Fatalf("%v records dropped as late: none is", n)
			}
		})
	}
}

// expectModel checks a model test's outputs, got, against the model's,
// want (both sorted), and that nothing went to the dead-letter topic.
func expectModel(t *testing.T, h *sluicetest.Harness, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%d outputs, want the model's %d;\nmissing %q\nextra %q", len(got), len(want), diff(want, got), diff(got, want))
	}
	if dl := h.DeadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters: %v", dl)
	}
}

// diff is what a has more of than b (both sorted).
func diff(a, b []string) []string {
	count := map[string]int{}
	for _, s := range b {
		count[s]++
	}
	var out []string
	for _, s := range a {
		if count[s] > 0 {
			count[s]--
			continue
		}
		out = append(out, s)
	}
	return out
}

// Bounds are inclusive at both ends, and the same records in the other
// order (right first) join the same way.
func TestIntervalJoinBounds(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, -100*time.Millisecond, 200*time.Millisecond, nil, ""), options(1, "", time.Second))
	// Key a: the left first; key b: the rights first. Rights at the
	// bounds join, one millisecond outside does not.
	for _, k := range []string{"a", "b"} {
		left := func() { h.SendTo("left", []byte(k), []byte("L"), at(1000)) }
		if k == "a" {
			left()
		}
		for _, ms := range []int64{899, 900, 1200, 1201} {
			h.SendTo("right", []byte(k), fmt.Appendf(nil, "R%d", ms), at(ms))
		}
		if k == "b" {
			// Settled first: in one poll the timestamp merge would take
			// this left (1000) before the rights of 1200 and 1201.
			h.Settle()
			left()
		}
	}
	h.Settle()
	want := []string{"a:L|R1200", "a:L|R900", "b:L|R1200", "b:L|R900"}
	if got := joined(h.Output()); !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// A record before the watermark is late: it joins nothing, and goes to
// LateOutput when one is bound, else is dropped and counted.
func TestIntervalJoinLateRecords(t *testing.T) {
	t.Parallel()
	for _, tag := range []sluice.OutputTag{"late", ""} {
		t.Run(fmt.Sprintf("LateOutput=%q", tag), func(t *testing.T) {
			t.Parallel()
			dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "late records dropped"})
			h := sluicetest.New(t, pairJob(t, -time.Second, time.Second, dropped, tag), options(1, "", 0))
			h.SendTo("left", []byte("k"), []byte("L1"), at(5000))
			h.SendTo("right", []byte("k"), []byte("R1"), at(5000)) // the watermark is now 5000
			h.SendTo("right", []byte("k"), []byte("R2"), at(4999)) // late: would have joined L1
			h.SendTo("left", []byte("k"), []byte("L2"), at(5500))
			h.Settle()
			if got, want := joined(h.Output()), []string{"k:L1|R1", "k:L2|R1"}; !slices.Equal(got, want) {
				t.Fatalf("outputs %q, want %q", got, want)
			}
			if tag != "" {
				late := h.SideOutput(tag)
				if got := joined(late); !slices.Equal(got, []string{"k:R2"}) {
					t.Fatalf("late output %q, want the late record R2", got)
				}
				if got := header(late[0], sluice.HeaderTopic); got != "right" {
					t.Fatalf("late record's %s header %q, want the side it came from", sluice.HeaderTopic, got)
				}
				return
			}
			if n := value(t, dropped); n != 1 {
				t.Fatalf("LateDropped %v, want 1", n)
			}
			if got := liveState(t, h, "ij.late-dropped"); len(got) != 1 {
				t.Fatalf("late-dropped state %q, want the count of key k", got)
			}
		})
	}
}

// liveState is the keyed entries of the state named name that the
// changelog holds a value for (not deleted): "<key>/<sub>".
func liveState(t *testing.T, h *sluicetest.Harness, name string) []string {
	t.Helper()
	live := map[string]bool{}
	for _, r := range h.Records(sluicetest.AppID + "-changelog") {
		k, err := kstate.DecodeKey(r.Key)
		if err != nil || k.Name != name {
			continue // markers and other state
		}
		id := string(k.UserKey) + "/" + fmt.Sprintf("%x", k.Sub)
		live[id] = r.Value != nil
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

// Buffered records go once the watermark passes their cleanup time: after
// records an hour later on both sides, only those two are left.
func TestIntervalJoinCleansItsBuffers(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, -time.Second, 2*time.Second, nil, ""), options(1, "", 0))
	for i := range int64(20) {
		k := []byte(fmt.Sprintf("k%d", i%4))
		h.SendTo("left", k, fmt.Appendf(nil, "L%d", i), at(1000+i*100))
		h.SendTo("right", k, fmt.Appendf(nil, "R%d", i), at(1050+i*100))
		// Keys with one side only: their entries go by their own
		// timers, not by the other side's later ones.
		h.SendTo("left", []byte("only-left"), fmt.Appendf(nil, "L%d", i), at(1000+i*100))
		h.SendTo("right", []byte("only-right"), fmt.Appendf(nil, "R%d", i), at(1050+i*100))
	}
	h.Settle()
	if n := len(liveState(t, h, "ij.left")) + len(liveState(t, h, "ij.right")); n == 0 {
		t.Fatal("nothing buffered before the watermark moved on: the check below would pass for nothing")
	}
	h.SendTo("left", []byte("k0"), []byte("Lz"), at(3_600_000))
	h.SendTo("right", []byte("k1"), []byte("Rz"), at(3_600_000))
	h.Settle()
	left, right := liveState(t, h, "ij.left"), liveState(t, h, "ij.right")
	if len(left) != 1 || !strings.HasPrefix(left[0], "k0/") || len(right) != 1 || !strings.HasPrefix(right[0], "k1/") {
		t.Fatalf("buffered after the watermark passed: left %q, right %q; want only the last two records", left, right)
	}
}

// A Join error fails the record being processed: dead-lettered, none of
// its pairs emitted, and not buffered, so a later partner does not find it.
func TestIntervalJoinErrorDeadLettersTheRecord(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, -time.Second, time.Second, nil, ""), options(1, "", time.Second))
	h.SendTo("left", []byte("k"), []byte("L1"), at(1000))
	h.SendTo("left", []byte("k"), []byte("bad"), at(1000))
	h.SendTo("right", []byte("k"), []byte("R1"), at(1100)) // joins L1, then fails on bad
	h.SendTo("left", []byte("k"), []byte("L2"), at(1200))  // R1 was not buffered
	h.Settle()
	if got := joined(h.Output()); len(got) != 0 {
		t.Fatalf("outputs %q, want none: the failed record's pair with L1 is not emitted", got)
	}
	dl := h.DeadLetters()
	if len(dl) != 1 || string(dl[0].Value) != "R1" {
		t.Fatalf("dead letters %v, want R1", dl)
	}
}

func TestIntervalSpecIsChecked(t *testing.T) {
	ok := join.IntervalSpec{Name: "j", Left: "a", Right: "b", Upper: time.Second, Timestamp: sluice.KafkaTime,
		Join: func([]byte, join.Element, join.Element) ([]byte, error) { return nil, nil }}
	job, err := join.Interval(ok)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"j.left", "j.right", "j.late-dropped"}; !slices.Equal(job.States, want) || !job.EventTime {
		t.Fatalf("job states %q, event time %v; want %q and event time", job.States, job.EventTime, want)
	}
	for name, mutate := range map[string]func(*join.IntervalSpec){
		"Name is empty":            func(s *join.IntervalSpec) { s.Name = "" },
		"must name the two":        func(s *join.IntervalSpec) { s.Right = "" },
		"want two topics":          func(s *join.IntervalSpec) { s.Right = "a" },
		"is after Upper":           func(s *join.IntervalSpec) { s.Lower = 2 * time.Second },
		"whole milliseconds":       func(s *join.IntervalSpec) { s.Upper = time.Microsecond },
		"Join is nil":              func(s *join.IntervalSpec) { s.Join = nil },
		"Timestamp is nil":         func(s *join.IntervalSpec) { s.Timestamp = nil },
		"negative bounds are fine": func(s *join.IntervalSpec) { s.Lower, s.Upper = -2*time.Second, -time.Second },
	} {
		s := ok
		mutate(&s)
		_, err := join.Interval(s)
		switch {
		case strings.HasSuffix(name, "fine"):
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case err == nil || !strings.Contains(err.Error(), name):
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// value is a counter's value.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A record at the watermark is not late, and still finds the entries whose
// cleanup time is the watermark: a left at 1000 with Upper 200 joins a
// right at 1200 that comes once the watermark is 1200.
func TestIntervalJoinAtTheWatermark(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, 0, 200*time.Millisecond, nil, ""), options(1, "", 0))
	h.SendTo("left", []byte("k"), []byte("L"), at(1000))
	h.SendTo("right", []byte("j"), []byte("Rj"), at(1200))
	h.SendTo("left", []byte("j"), []byte("Lj"), at(1200)) // both topics at 1200: the watermark is 1200
	h.SendTo("right", []byte("k"), []byte("R"), at(1200))
	h.Settle()
	if got, want := joined(h.Output()), []string{"j:Lj|Rj", "k:L|R"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// header is the value of r's header key.
func header(r sluice.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// The mirror of TestIntervalJoinAtTheWatermark for the right side: a right
// at 1000 with Lower -200 is kept until the watermark passes 1200, so a
// left at 1200 that comes once the watermark is 1200 joins it.
func TestIntervalJoinAtTheWatermarkRightSide(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, -200*time.Millisecond, 0, nil, ""), options(1, "", 0))
	h.SendTo("right", []byte("k"), []byte("R"), at(1000))
	h.SendTo("left", []byte("j"), []byte("Lj"), at(1200))
	h.SendTo("right", []byte("j"), []byte("Rj"), at(1200)) // both topics at 1200: the watermark is 1200
	// Settled first: in one poll the merge would take the left below
	// before the right at 1200 (ties go to the topic named first).
	h.Settle()
	h.SendTo("left", []byte("k"), []byte("L"), at(1200))
	h.Settle()
	if got, want := joined(h.Output()), []string{"j:Lj|Rj", "k:L|R"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// Records of one side, key and millisecond are kept apart (by their
// offsets): a right joins both lefts.
func TestIntervalJoinSameMillisecond(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, 0, 0, nil, ""), options(1, "", 0))
	h.SendTo("left", []byte("k"), []byte("L1"), at(1000))
	h.SendTo("left", []byte("k"), []byte("L2"), at(1000))
	h.SendTo("right", []byte("k"), []byte("R"), at(1000))
	h.Settle()
	if got, want := joined(h.Output()), []string{"k:L1|R", "k:L2|R"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// A record without a key is dead-lettered: which records it would pair
// with would depend on the partition it landed on. A nil Join value emits
// nothing for its pair.
func TestIntervalJoinNoKeyAndNilValue(t *testing.T) {
	t.Parallel()
	job, err := join.Interval(join.IntervalSpec{
		Name: "ij", Left: "left", Right: "right", Upper: time.Second, Timestamp: sluice.KafkaTime,
		Join: func(key []byte, l, r join.Element) ([]byte, error) {
			if string(r.Value) == "skip" {
				return nil, nil
			}
			return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, options(1, "", time.Second))
	h.SendTo("left", nil, []byte("L0"), at(1000))
	h.SendTo("left", []byte("k"), []byte("L"), at(1000))
	h.SendTo("right", []byte("k"), []byte("skip"), at(1100))
	h.SendTo("right", []byte("k"), []byte("R"), at(1200))
	h.Settle()
	if got, want := joined(h.Output()), []string{"k:L|R"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	dl := h.DeadLetters()
	if len(dl) != 1 || string(dl[0].Value) != "L0" || !strings.Contains(header(dl[0], sluice.HeaderError), "without a key") {
		t.Fatalf("dead letters %v, want L0, the record without a key", dl)
	}
}

// A record whose cleanup time is the watermark can still join a record at
// the watermark, so it is buffered: with Upper -100, a left at 1100 comes
// when the watermark is 1000, and a right at 1000 joins it.
func TestIntervalJoinKeepsWhatCanStillJoin(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, pairJob(t, -300*time.Millisecond, -100*time.Millisecond, nil, ""), options(1, "", 0))
	h.SendTo("left", []byte("j"), []byte("Lj"), at(1000))
	h.SendTo("right", []byte("j"), []byte("Rj"), at(1000)) // the watermark is 1000
	h.Settle()
	h.SendTo("left", []byte("k"), []byte("L"), at(1100)) // cleanup time 1000
	h.Settle()
	h.SendTo("right", []byte("k"), []byte("R"), at(1000)) // at the watermark: not late
	h.Settle()
	if got, want := joined(h.Output()), []string{"k:L|R"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// flush sends records of keys of their own ("z0"…"z9"), on both sides so
// in both partitions, far later than events' records, and settles: the
// watermark passes every other record.
func flush(h *sluicetest.Harness) {
	for i := range 10 {
		for _, topic := range []string{"left", "right"} {
			h.SendTo(topic, fmt.Appendf(nil, "z%d", i), []byte("flush"), at(10_000))
		}
	}
	h.Settle()
}

// unflushed is outputs without the flush keys' ("z…").
func unflushed(outputs []string) []string {
	return slices.DeleteFunc(outputs, func(s string) bool { return strings.HasPrefix(s, "z") })
}

// sendWithAKill sends es, as sendKilled does: the first 150, then 150
// more, then the rest.
func sendWithAKill(h *sluicetest.Harness, es []event) {
	sendKilled(h, len(es), 150, 300, func(i int) {
		e := es[i]
		h.SendTo(e.topic, []byte(e.key), []byte(e.value), at(e.ts))
	})
}

// sendKilled sends records 0 to n-1 with send: those before settled are
// settled, then those up to killed are sent before the instance is killed
// (what it had not committed is processed again) and restarted, then the
// rest.
func sendKilled(h *sluicetest.Harness, n, settled, killed int, send func(i int)) {
	for i := range n {
		switch i {
		case settled:
			h.Settle()
		case killed:
			h.Kill()
			h.Restart()
		}
		send(i)
	}
}

// events is the model tests' stream: n records of five keys on either
// side, each 10 ms after the one before, out of order by up to 40 ms
// either way.
func events(seed uint64, n int) []event {
	rng := rand.New(rand.NewPCG(seed, 2))
	var es []event
	for i := range n {
		topic := []string{"left", "right"}[rng.IntN(2)]
		es = append(es, event{
			topic: topic,
			key:   fmt.Sprintf("k%d", rng.IntN(5)),
			value: fmt.Sprintf("%s%d", topic[:1], i),
			ts:    int64(i)*10 + rng.Int64N(81) - 40,
		})
	}
	return es
}

// Outer joins: besides the pairs, each record of an outer side that joined
// nothing comes out once, stamped with its time, when the watermark passes
// the last time a partner could come; exactly the model's, across a kill
// -9 mid-stream, on both backends. Flush records of keys of their own (on
// both sides, so in both partitions) move the watermark past every other
// record at the end; they join each other and are left out of the check.
func TestOuterIntervalJoinMatchesModel(t *testing.T) {
	t.Parallel()
	type bounds struct{ lower, upper int64 } // ms
	for _, tc := range []struct {
		kind, backend string
		bounds
	}{
		{"left", "bbolt", bounds{-30, 50}}, {"left", "memory", bounds{-30, 50}},
		{"right", "bbolt", bounds{-30, 50}}, {"right", "memory", bounds{-30, 50}},
		{"full", "bbolt", bounds{-30, 50}}, {"full", "memory", bounds{-30, 50}},
		// Bounds that exclude 0: records of one side come already past
		// their cleanup time, and are emitted at once when unmatched.
		{"full", "bbolt", bounds{90, 200}}, {"full", "memory", bounds{-200, -90}},
	} {
		kind, backend, lower, upper := tc.kind, tc.backend, tc.lower, tc.upper
		t.Run(fmt.Sprintf("%s/%s/%d..%d", kind, backend, lower, upper), func(t *testing.T) {
			t.Parallel()
			es := events(9, 400)
			outerLeft, outerRight := kind != "right", kind != "left"
			var want []string
			joined := map[int]bool{}
			for i, l := range es {
				for j, r := range es {
					if l.topic == "left" && r.topic == "right" && l.key == r.key && r.ts-l.ts >= lower && r.ts-l.ts <= upper {
						want = append(want, fmt.Sprintf("%s:%s|%s@%d", l.key, l.value, r.value, max(l.ts, r.ts)))
						joined[i], joined[j] = true, true
					}
				}
			}
			for i, e := range es {
				if !joined[i] && (e.topic == "left" && outerLeft || e.topic == "right" && outerRight) {
					want = append(want, fmt.Sprintf("%s:%s|-@%d", e.key, e.value, e.ts))
				}
			}
			slices.Sort(want)
			if n := len(want); n < 150 {
				t.Fatalf("the model has %d outputs: too few to test anything", n)
			}
			spec := join.IntervalSpec{
				Name: "oj", Left: "left", Right: "right", Lower: time.Duration(lower) * time.Millisecond, Upper: time.Duration(upper) * time.Millisecond,
				Timestamp: sluice.KafkaTime,
				Join: func(key []byte, l, r join.Element) ([]byte, error) {
					return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
				},
			}
			unmatched := func(_ []byte, e join.Element) []byte { return fmt.Appendf(nil, "%s|-", e.Value) }
			if outerLeft {
				spec.LeftUnmatched = unmatched
			}
			if outerRight {
				spec.RightUnmatched = unmatched
			}
			job, err := join.Interval(spec)
			if err != nil {
				t.Fatal(err)
			}
			h := sluicetest.New(t, job, options(2, backend, 100*time.Millisecond))
			sendWithAKill(h, es)
			flush(h)
			expectModel(t, h, unflushed(joinedAt(h.Output())), want)
			// Every record but the flush ones was cleaned, and its
			// mark with it.
			for _, name := range []string{"oj.left", "oj.right", "oj.left-matched", "oj.right-matched"} {
				for _, e := range liveState(t, h, name) {
					if !strings.HasPrefix(e, "z") {
						t.Fatalf("%s holds %s after every cleanup", name, e)
					}
				}
			}
		})
	}
}

// A record of an outer side that comes already past its cleanup time (the
// bounds exclude 0, so a right record is due before its own time) is
// emitted unmatched at once if it joined nothing, and not if it did; a
// buffered left record that a later right record joined is not emitted
// unmatched at its cleanup.
func TestOuterIntervalJoinPastItsCleanup(t *testing.T) {
	t.Parallel()
	unmatched := func(_ []byte, e join.Element) []byte { return fmt.Appendf(nil, "%s|-", e.Value) }
	job, err := join.Interval(join.IntervalSpec{
		Name: "oj", Left: "left", Right: "right", Lower: 10 * time.Millisecond, Upper: 50 * time.Millisecond,
		Timestamp: sluice.KafkaTime,
		Join: func(_ []byte, l, r join.Element) ([]byte, error) {
			return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
		},
		LeftUnmatched:  unmatched,
		RightUnmatched: unmatched,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, options(1, "bbolt", 0))
	// Settled one by one, so that each comes with the watermark at the
	// record before it; the watermark is the lower of the two topics',
	// which x's record moves on the right.
	h.SendTo("left", []byte("k"), []byte("L"), at(1000))
	h.SendTo("right", []byte("x"), []byte("X"), at(1000))
	h.Settle()
	h.SendTo("right", []byte("k"), []byte("R1"), at(1005)) // wants a left in [955, 995]: none
	h.Settle()
	// The watermark to 1045, which R2's timer (1041, its cleanup time
	// 1040 + 1) is behind and L's (1051) ahead of.
	h.SendTo("left", []byte("y"), []byte("Y"), at(1060))
	h.SendTo("right", []byte("y"), []byte("W"), at(1045))
	h.Settle()
	h.SendTo("right", []byte("k"), []byte("R2"), at(1050)) // [1000, 1040]: L
	h.Settle()
	h.SendTo("left", []byte("z"), []byte("flush"), at(5000))
	h.SendTo("right", []byte("z"), []byte("flush"), at(5000))
	h.Settle()
	got := outputsOf(h, "k")
	if want := []string{"k:L|R2@1050", "k:R1|-@1005"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// A record buffered under other bounds (Upper raised across a restart) is
// cleaned by its new cleanup time, not its old one, and, unmatched, still
// comes out: the old timer finds it not due and sets the new one.
func TestOuterIntervalJoinBoundsChanged(t *testing.T) {
	t.Parallel()
	spec := func(upper time.Duration) sluice.Job {
		job, err := join.Interval(join.IntervalSpec{
			Name: "oj", Left: "left", Right: "right", Lower: 0, Upper: upper,
			Timestamp: sluice.KafkaTime,
			Join: func(_ []byte, l, r join.Element) ([]byte, error) {
				return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
			},
			LeftUnmatched: func(_ []byte, e join.Element) []byte { return fmt.Appendf(nil, "%s|-", e.Value) },
		})
		if err != nil {
			t.Fatal(err)
		}
		return job
	}
	before, after := spec(50*time.Millisecond), spec(100*time.Millisecond)
	current := &before
	job := before
	job.Process = func(ctx sluice.Context, rec *sluice.Record) error { return current.Process(ctx, rec) }
	job.OnTimer = func(ctx sluice.Context, tm sluice.Timer) error { return current.OnTimer(ctx, tm) }
	h := sluicetest.New(t, job, options(1, "bbolt", 0))
	h.SendTo("left", []byte("k"), []byte("L"), at(1000)) // its timer: 1051
	h.Settle()
	current = &after // L's cleanup time is now 1100
	h.Restart()
	for _, ms := range []int64{1060, 1200} { // past the old timer, then past the new one
		h.SendTo("left", []byte("x"), []byte("X"), at(ms))
		h.SendTo("right", []byte("x"), []byte("X"), at(ms))
		h.Settle()
	}
	got := outputsOf(h, "k")
	if want := []string{"k:L|-@1000"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	if live := liveState(t, h, "oj.left"); len(live) != 1 { // x's last left record only
		t.Fatalf("left entries left: %v, want x's last", live)
	}
}

// An outer join's unmatched record comes out once the watermark passes its
// cleanup time, not when it reaches it; a Join error on a pair drops the
// failed record's mark with its other writes, so its partner, joined by
// nothing that committed, comes out unmatched.
func TestOuterIntervalJoinTimingAndFailedPairs(t *testing.T) {
	t.Parallel()
	job, err := join.Interval(join.IntervalSpec{
		Name: "oj", Left: "left", Right: "right", Lower: 0, Upper: 50 * time.Millisecond,
		Timestamp: sluice.KafkaTime,
		Join: func(_ []byte, l, r join.Element) ([]byte, error) {
			if string(r.Value) == "bad" {
				return nil, errors.New("cannot join bad")
			}
			return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
		},
		LeftUnmatched: func(_ []byte, e join.Element) []byte { return fmt.Appendf(nil, "%s|-", e.Value) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, options(1, "bbolt", 0))
	h.SendTo("left", []byte("k"), []byte("L"), at(1000)) // cleanup time 1050
	h.SendTo("right", []byte("k"), []byte("bad"), at(1010))
	h.Settle()
	moveTo := func(ms int64) []string {
		h.SendTo("left", []byte("x"), []byte("X"), at(ms))
		h.SendTo("right", []byte("x"), []byte("X"), at(ms))
		h.Settle()
		return outputsOf(h, "k")
	}
	if got := moveTo(1050); len(got) != 0 {
		t.Fatalf("outputs %q with the watermark at L's cleanup time, want none yet", got)
	}
	if got, want := moveTo(1051), []string{"k:L|-@1000"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q with the watermark past L's cleanup time, want %q", got, want)
	}
	if dl := h.DeadLetters(); len(dl) != 1 || string(dl[0].Value) != "bad" {
		t.Fatalf("dead letters %v, want bad's", dl)
	}
}

// An outer join declares its marks' states, an inner one none.
func TestOuterIntervalJoinStates(t *testing.T) {
	unmatched := func(_ []byte, e join.Element) []byte { return nil }
	for _, tc := range []struct {
		left, right bool
		want        []string
	}{
		{false, false, []string{"ij.left", "ij.right", "ij.late-dropped"}},
		{true, false, []string{"ij.left", "ij.right", "ij.late-dropped", "ij.left-matched"}},
		{true, true, []string{"ij.left", "ij.right", "ij.late-dropped", "ij.left-matched", "ij.right-matched"}},
	} {
		spec := join.IntervalSpec{Name: "ij", Left: "left", Right: "right", Timestamp: sluice.KafkaTime,
			Join: func([]byte, join.Element, join.Element) ([]byte, error) { return nil, nil }}
		if tc.left {
			spec.LeftUnmatched = unmatched
		}
		if tc.right {
			spec.RightUnmatched = unmatched
		}
		job, err := join.Interval(spec)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(job.States, tc.want) {
			t.Errorf("left %v right %v: states %v, want %v", tc.left, tc.right, job.States, tc.want)
		}
	}
}

// outputsOf is joinedAt of the outputs of key.
func outputsOf(h *sluicetest.Harness, key string) []string {
	var got []string
	for _, s := range joinedAt(h.Output()) {
		if strings.HasPrefix(s, key+":") {
			got = append(got, s)
		}
	}
	return got
}
