package join_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/join"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// windowPairs joins "left" and "right" in the assigner's windows and emits
// "<left value>|<right value>"; a left value "bad" fails the firing, a
// right value "skip" emits nothing for its pairs.
func windowPairs(t *testing.T, a window.Assigner, dropped prometheus.Counter, late sluice.OutputTag) sluice.Job {
	t.Helper()
	job, err := join.Window(join.WindowSpec{
		Name: "wj", Left: "left", Right: "right", Assigner: a,
		Timestamp: sluice.KafkaTime, LateDropped: dropped, LateOutput: late,
		Join: func(key []byte, w window.Window, l, r join.Element) ([]byte, error) {
			switch {
			case string(l.Value) == "bad":
				return nil, errors.New("cannot join bad")
			case string(r.Value) == "skip":
				return nil, nil
			case !inWindow(w, l) || !inWindow(w, r):
				return nil, fmt.Errorf("%s or %s is not in %s", l.Timestamp, r.Timestamp, w)
			}
			return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// valuesJoin is s, joining "left" and "right" in tumbling windows of a
// second by their Kafka times into "<left value>|<right value>".
func valuesJoin(t *testing.T, s join.WindowSpec) sluice.Job {
	t.Helper()
	s.Name, s.Left, s.Right = "wj", "left", "right"
	s.Assigner, s.Timestamp = window.TumblingEventTime(time.Second), sluice.KafkaTime
	s.Join = func(key []byte, w window.Window, l, r join.Element) ([]byte, error) {
		return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
	}
	job, err := join.Window(s)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

func inWindow(w window.Window, e join.Element) bool {
	return !e.Timestamp.Before(w.Start) && e.Timestamp.Before(w.End)
}

// span is a window of the model, in ms after base.
type span struct{ start, end int64 }

// modelWindows is the windows of size and slide (ms) that hold ms: the
// starts are multiples of slide (base is a multiple of every slide used).
func modelWindows(ms, size, slide int64) []span {
	last := ms - ((ms%slide)+slide)%slide
	var out []span
	for s := last; s > ms-size; s -= slide {
		out = append(out, span{s, s + size})
	}
	return out
}

// modelSessions is each key's sessions of gap (ms): a record's window is
// [t, t+gap), and windows of a key that overlap or touch are one.
func modelSessions(es []event, gap int64) map[string][]span {
	byKey := map[string][]int64{}
	for _, e := range es {
		byKey[e.key] = append(byKey[e.key], e.ts)
	}
	out := map[string][]span{}
	for k, ts := range byKey {
		slices.Sort(ts)
		for _, t := range ts {
			if n := len(out[k]); n > 0 && t <= out[k][n-1].end {
				out[k][n-1].end = max(out[k][n-1].end, t+gap)
				continue
			}
			out[k] = append(out[k], span{t, t + gap})
		}
	}
	return out
}

// The join's outputs are exactly a brute-force model's: for each window of
// each key, every left record in it with every right record in it, stamped
// with the window's last millisecond; for tumbling, sliding and session
// windows, across a kill -9 mid-stream, on both backends. Records come out
// of order by up to 80 ms and the watermark is 100 ms behind, so none is
// late (checked: nothing dropped). Flush records of keys of their own, far
// later, move the watermark past every window of the others at the end;
// every window of those is then cleared from state.
func TestWindowJoinMatchesModel(t *testing.T) {
	t.Parallel()
	const size, slide, gap = 100, 50, 40 // ms
	for _, kind := range []string{"tumbling", "sliding", "session"} {
		for _, backend := range []string{"bbolt", "memory"} {
			t.Run(kind+"/"+backend, func(t *testing.T) {
				t.Parallel()
				es := events(21, 400)
				var assigner window.Assigner
				windowsOf := func(e event) []span { return modelWindows(e.ts, size, size) }
				switch kind {
				case "tumbling":
					assigner = window.TumblingEventTime(size * time.Millisecond)
				case "sliding":
					assigner = window.SlidingEventTime(size*time.Millisecond, slide*time.Millisecond)
					windowsOf = func(e event) []span { return modelWindows(e.ts, size, slide) }
				case "session":
					assigner = window.EventTimeSession(gap * time.Millisecond)
					sessions := modelSessions(es, gap)
					windowsOf = func(e event) []span {
						for _, s := range sessions[e.key] {
							if e.ts >= s.start && e.ts < s.end {
								return []span{s}
							}
						}
						panic("a record in no session")
					}
				}
				var want []string
				sessionsSeen := map[span]bool{}
				for _, l := range es {
					for _, r := range es {
						if l.topic != "left" || r.topic != "right" || l.key != r.key {
							continue
						}
						for _, w := range windowsOf(l) {
							if slices.Contains(windowsOf(r), w) {
								want = append(want, fmt.Sprintf("%s:%s|%s@%d", l.key, l.value, r.value, w.end-1))
								sessionsSeen[w] = true
							}
						}
					}
				}
				slices.Sort(want)
				if len(want) < 150 {
					t.Fatalf("the model has %d pairs: too few to test anything", len(want))
				}
				if kind == "session" && len(sessionsSeen) < 20 {
					t.Fatalf("the model's pairs are in %d sessions: too few to test merging", len(sessionsSeen))
				}

				dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "late records dropped"})
				h := sluicetest.New(t, windowPairs(t, assigner, dropped, ""), options(2, backend, 100*time.Millisecond))
				sendWithAKill(h, es)
				flush(h)
				expectModel(t, h, joinedAt(h.Output()), want)
				if n := value(t, dropped); n != 0 {
					t.Fatalf("%v records dropped as late: none is", n)
				}
				for _, name := range []string{"wj.windows", "wj.elements"} {
					live := liveState(t, h, name)
					if len(live) == 0 {
						t.Fatalf("%s holds nothing: the flush records' windows should be there", name)
					}
					for _, e := range live {
						if !strings.HasPrefix(e, "z") {
							t.Fatalf("%s holds %s after every window fired", name, e)
						}
					}
				}
			})
		}
	}
}

// CoGroup gets both sides of a window, one of them possibly empty, so it
// makes a full outer join: across a kill -9, each key's window emits its
// pairs, or its records of one side alone when the other has none, as the
// model does.
func TestWindowCoGroupOuterJoin(t *testing.T) {
	t.Parallel()
	const size = 60 // ms: small enough that many windows have one side only
	es := events(5, 300)
	type group struct{ left, right []string }
	model := map[string]*group{} // "key@window end"
	for _, e := range es {
		w := modelWindows(e.ts, size, size)[0]
		id := fmt.Sprintf("%s@%d", e.key, w.end-1)
		if model[id] == nil {
			model[id] = &group{}
		}
		if e.topic == "left" {
			model[id].left = append(model[id].left, e.value)
		} else {
			model[id].right = append(model[id].right, e.value)
		}
	}
	orNone := func(vs []string) []string {
		if len(vs) == 0 {
			return []string{"-"}
		}
		return vs
	}
	var want []string
	oneSided := 0
	for id, g := range model {
		key, stamp, _ := strings.Cut(id, "@")
		if len(g.left) == 0 || len(g.right) == 0 {
			oneSided++
		}
		for _, l := range orNone(g.left) {
			for _, r := range orNone(g.right) {
				want = append(want, fmt.Sprintf("%s:%s|%s@%s", key, l, r, stamp))
			}
		}
	}
	slices.Sort(want)
	if oneSided < 20 || len(want) < 150 {
		t.Fatalf("the model has %d outputs, %d windows of one side: too few to test anything", len(want), oneSided)
	}
	job, err := join.Window(join.WindowSpec{
		Name: "cg", Left: "left", Right: "right", Assigner: window.TumblingEventTime(size * time.Millisecond),
		Timestamp: sluice.KafkaTime,
		CoGroup: func(key []byte, w window.Window, left, right []join.Element, emit func([]byte)) error {
			if len(left) == 0 && len(right) == 0 {
				return errors.New("CoGroup called with neither side")
			}
			none := []join.Element{{Value: []byte("-")}}
			if len(left) == 0 {
				left = none
			}
			if len(right) == 0 {
				right = none
			}
			for _, l := range left {
				for _, r := range right {
					emit(fmt.Appendf(nil, "%s|%s", l.Value, r.Value))
				}
			}
			emit(nil) // emits nothing
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, options(2, "", 100*time.Millisecond))
	sendWithAKill(h, es)
	flush(h)
	expectModel(t, h, unflushed(joinedAt(h.Output())), want)
}

// Elements carry their record's value, event time, partition and offset
// through the window's state; pairs come left by left in the order the
// records came, and a nil value emits nothing for its pair.
func TestWindowJoinElements(t *testing.T) {
	t.Parallel()
	var seen []string
	calls := 0 // Timestamp's: once a record, not again for the element
	job, err := join.Window(join.WindowSpec{
		Name: "wj", Left: "left", Right: "right", Assigner: window.TumblingEventTime(time.Second),
		Timestamp: func(rec *sluice.Record) (time.Time, error) {
			calls++
			return base.Add(time.Duration(rec.Value[1]-'0') * 100 * time.Millisecond), nil
		},
		Join: func(key []byte, w window.Window, l, r join.Element) ([]byte, error) {
			seen = append(seen, fmt.Sprintf("%s@%d/%d:%d|%s@%d/%d:%d in %d..%d", l.Value, l.Timestamp.Sub(base).Milliseconds(), l.Partition, l.Offset,
				r.Value, r.Timestamp.Sub(base).Milliseconds(), r.Partition, r.Offset, w.Start.Sub(base).Milliseconds(), w.End.Sub(base).Milliseconds()))
			if string(r.Value) == "r3" {
				return nil, nil
			}
			return fmt.Appendf(nil, "%s|%s", l.Value, r.Value), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, options(1, "", 0))
	// Values "<side><tenths of a second>": the event time is in the
	// value, the Kafka time far off, so the extractor's answer shows.
	for _, s := range []struct{ topic, v string }{{"left", "l1"}, {"right", "r2"}, {"left", "l4"}, {"right", "r3"}, {"right", "r5"}} {
		h.SendTo(s.topic, []byte("k"), []byte(s.v), at(60_000))
	}
	// Event time 2 s on both sides (a task's watermark is the smaller
	// of its inputs') moves the watermark past the first window.
	h.SendTo("left", []byte("z"), []byte{'l', '0' + 20}, at(0))
	h.SendTo("right", []byte("z"), []byte{'r', '0' + 20}, at(0))
	h.Settle()
	wantSeen := []string{
		"l1@100/0:0|r2@200/0:0 in 0..1000", "l1@100/0:0|r3@300/0:1 in 0..1000", "l1@100/0:0|r5@500/0:2 in 0..1000",
		"l4@400/0:1|r2@200/0:0 in 0..1000", "l4@400/0:1|r3@300/0:1 in 0..1000", "l4@400/0:1|r5@500/0:2 in 0..1000",
	}
	if !slices.Equal(seen, wantSeen) {
		t.Fatalf("Join saw\n%q\nwant\n%q", seen, wantSeen)
	}
	if calls != 7 {
		t.Errorf("Timestamp called %d times for 7 records, want once each", calls)
	}
	var got []string
	for _, r := range h.Output() {
		got = append(got, fmt.Sprintf("%s:%s@%d", r.Key, r.Value, r.Timestamp.Sub(base).Milliseconds()))
	}
	want := []string{"k:l1|r2@999", "k:l1|r5@999", "k:l4|r2@999", "k:l4|r5@999"}
	if !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q in this order", got, want)
	}
}

// A Join error fails the window's firing: none of its pairs is emitted and
// the firing is dead-lettered as a timer's; the key's next window still
// fires. A record without a key is dead-lettered, saying so.
func TestWindowJoinErrorFailsTheFiring(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, windowPairs(t, window.TumblingEventTime(time.Second), nil, ""), options(1, "", 0))
	h.SendTo("left", nil, []byte("L0"), at(50))
	h.SendTo("left", []byte("k"), []byte("L1"), at(100))
	h.SendTo("right", []byte("k"), []byte("R1"), at(200))
	h.SendTo("left", []byte("k"), []byte("bad"), at(300))
	h.SendTo("left", []byte("k"), []byte("L2"), at(1100))
	h.SendTo("right", []byte("k"), []byte("R2"), at(1200))
	h.SendTo("left", []byte("k"), []byte("L3"), at(5000))
	h.SendTo("right", []byte("k"), []byte("R3"), at(5000)) // fires both windows
	h.Settle()
	if got, want := joinedAt(h.Output()), []string{"k:L2|R2@1999"}; !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q: the failed window's pair L1|R1 is not emitted", got, want)
	}
	dl := h.DeadLetters()
	if len(dl) != 2 || string(dl[0].Value) != "L0" || !strings.Contains(header(dl[0], sluice.HeaderError), "without a key") {
		t.Fatalf("dead letters %v, want L0, the record without a key, then the first window's firing", dl)
	}
	if header(dl[1], sluice.HeaderStage) != "timer" || !strings.Contains(header(dl[1], sluice.HeaderError), "cannot join bad") {
		t.Fatalf("dead letter %v (headers %v), want the first window's firing", dl[1], dl[1].Headers)
	}
}

// A record too late for every window it belongs to goes to LateOutput with
// a header naming its topic, or is dropped and counted; the window it
// missed is not fired again.
func TestWindowJoinLateRecords(t *testing.T) {
	t.Parallel()
	for _, withOutput := range []bool{true, false} {
		t.Run(fmt.Sprintf("output=%v", withOutput), func(t *testing.T) {
			t.Parallel()
			var late sluice.OutputTag
			if withOutput {
				late = "late"
			}
			dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "late records dropped"})
			h := sluicetest.New(t, windowPairs(t, window.TumblingEventTime(time.Second), dropped, late), options(1, "", 0))
			h.SendTo("left", []byte("k"), []byte("L1"), at(100))
			h.SendTo("right", []byte("k"), []byte("R1"), at(200))
			h.SendTo("left", []byte("k"), []byte("L2"), at(2000))
			h.SendTo("right", []byte("k"), []byte("R2"), at(2000)) // the first window fires
			// Settled first: co-processing would take R-late before L2,
			// in time order.
			h.Settle()
			h.SendTo("right", []byte("k"), []byte("R-late"), at(300))
			h.Settle()
			if got, want := joinedAt(h.Output()), []string{"k:L1|R1@999"}; !slices.Equal(got, want) {
				t.Fatalf("outputs %q, want %q", got, want)
			}
			if !withOutput {
				if n := value(t, dropped); n != 1 {
					t.Fatalf("%v dropped, want 1", n)
				}
				return
			}
			side := h.SideOutput(late)
			if len(side) != 1 || string(side[0].Value) != "R-late" || header(side[0], sluice.HeaderTopic) != "right" {
				t.Fatalf("late output %v, want R-late with its topic", side)
			}
			if n := value(t, dropped); n != 0 {
				t.Fatalf("%v dropped, want none: it went to the side output", n)
			}
		})
	}
}

// With AllowedLateness a record that comes after its window fired, within
// the lateness, fires the window again with every pair it holds; at end +
// lateness the window is cleared, and a record later than that is dropped.
func TestWindowJoinAllowedLateness(t *testing.T) {
	t.Parallel()
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped", Help: "late records dropped"})
	h := sluicetest.New(t, valuesJoin(t, join.WindowSpec{AllowedLateness: time.Second, LateDropped: dropped}), options(1, "", 0))
	h.SendTo("left", []byte("k"), []byte("L1"), at(100))
	h.SendTo("right", []byte("k"), []byte("R1"), at(200))
	h.SendTo("left", []byte("k"), []byte("L2"), at(1000))
	h.SendTo("right", []byte("k"), []byte("R2"), at(1000)) // [0,1000) fires
	h.Settle()
	h.SendTo("right", []byte("k"), []byte("Rlate"), at(500)) // within the lateness: fires again
	h.Settle()
	h.SendTo("left", []byte("k"), []byte("L3"), at(2000))
	h.SendTo("right", []byte("k"), []byte("R3"), at(2000)) // [0,1000) cleared; [1000,2000) fires
	h.Settle()
	h.SendTo("right", []byte("k"), []byte("Rlater"), at(600)) // past the lateness: dropped
	h.Settle()
	want := []string{"k:L1|R1@999", "k:L1|R1@999", "k:L1|Rlate@999", "k:L2|R2@1999"}
	if got := joinedAt(h.Output()); !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	if n := value(t, dropped); n != 1 {
		t.Fatalf("%v dropped, want 1 (Rlater)", n)
	}
	// Left are the windows [1000,2000) (fired, within its lateness) and
	// [2000,3000).
	if n := len(liveState(t, h, "wj.elements")); n != 4 {
		t.Fatalf("%d elements in state, want 4: L2, R2, L3, R3 (the first window's are cleared)", n)
	}
}

// In processing time a record joins the window of the clock's reading when
// it is processed, and its Element's Timestamp is its Kafka time.
func TestWindowJoinInProcessingTime(t *testing.T) {
	t.Parallel()
	job, err := join.Window(join.WindowSpec{
		Name: "pj", Left: "left", Right: "right", Assigner: window.TumblingProcessingTime(time.Minute),
		Join: func(key []byte, w window.Window, l, r join.Element) ([]byte, error) {
			return fmt.Appendf(nil, "%s@%d|%s@%d", l.Value, l.Timestamp.Sub(base).Milliseconds(), r.Value, r.Timestamp.Sub(base).Milliseconds()), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := sluicetest.New(t, job, sluicetest.Options{InputTopics: []string{"left", "right"}})
	start := h.Now()
	h.SendTo("left", []byte("k"), []byte("L1"), at(7))
	h.SendTo("right", []byte("k"), []byte("R1"), at(8))
	h.Settle()
	h.Advance(time.Minute)
	h.SendTo("right", []byte("k"), []byte("R2"), at(9)) // the next window: no partner
	h.Settle()
	h.Advance(time.Minute)
	h.Settle()
	out := h.Output()
	if len(out) != 1 || string(out[0].Value) != "L1@7|R1@8" || !out[0].Timestamp.Equal(start.Truncate(time.Minute).Add(time.Minute-time.Millisecond)) {
		t.Fatalf("outputs %v, want L1|R1 with their Kafka times, stamped at the first window's last millisecond", out)
	}
}

func TestWindowSpecIsChecked(t *testing.T) {
	ok := join.WindowSpec{Name: "j", Left: "a", Right: "b", Assigner: window.TumblingEventTime(time.Second), Timestamp: sluice.KafkaTime,
		Join: func([]byte, window.Window, join.Element, join.Element) ([]byte, error) { return nil, nil }}
	if _, err := join.Window(ok); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	coGroup := func([]byte, window.Window, []join.Element, []join.Element, func([]byte)) error { return nil }
	for name, change := range map[string]func(s *join.WindowSpec){
		"no name":           func(s *join.WindowSpec) { s.Name = "" },
		"no right":          func(s *join.WindowSpec) { s.Right = "" },
		"same topics":       func(s *join.WindowSpec) { s.Right = s.Left },
		"no function":       func(s *join.WindowSpec) { s.Join = nil },
		"both functions":    func(s *join.WindowSpec) { s.CoGroup = coGroup },
		"no assigner":       func(s *join.WindowSpec) { s.Assigner = window.Assigner{} },
		"no timestamp":      func(s *join.WindowSpec) { s.Timestamp = nil },
		"negative lateness": func(s *join.WindowSpec) { s.AllowedLateness = -time.Second },
		"processing-time late": func(s *join.WindowSpec) {
			s.Assigner, s.LateOutput = window.TumblingProcessingTime(time.Second), "late"
		},
		"count windows": func(s *join.WindowSpec) { s.Assigner, s.Timestamp = window.TumblingCount(2), nil },
	} {
		s := ok
		change(&s)
		if _, err := join.Window(s); err == nil {
			t.Errorf("%s: Window accepted it", name)
		} else if !strings.Contains(err.Error(), `window join "`) {
			t.Errorf("%s: %v does not name the join", name, err)
		}
	}
	s := ok
	s.Join, s.CoGroup = nil, coGroup
	if _, err := join.Window(s); err != nil {
		t.Fatalf("CoGroup alone: %v", err)
	}
}

// Early firings: with EarlyCount 2 a window fires at its second and fourth
// record with the pairs so far, then at its end with all of them.
func TestWindowJoinEarlyFirings(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, valuesJoin(t, join.WindowSpec{EarlyCount: 2}), options(1, "", 0))
	h.SendTo("left", []byte("k"), []byte("L1"), at(100))
	h.SendTo("right", []byte("k"), []byte("R1"), at(200)) // 2: L1|R1
	h.SendTo("left", []byte("k"), []byte("L2"), at(300))
	h.SendTo("right", []byte("k"), []byte("R2"), at(400)) // 4: the four pairs
	h.SendTo("left", []byte("k"), []byte("L3"), at(2000))
	h.SendTo("right", []byte("k"), []byte("R3"), at(3500)) // the end: the four again
	h.Settle()
	var got []string
	for _, r := range h.Output() {
		got = append(got, string(r.Value))
	}
	want := []string{"L1|R1", "L1|R1", "L1|R2", "L2|R1", "L2|R2", "L1|R1", "L1|R2", "L2|R1", "L2|R2"}
	if !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}
