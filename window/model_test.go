package window_test

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// model is a plain in-memory statement of the semantics of docs/windows.md
// for one partition: the watermark is the largest time seen minus the
// out-of-orderness and moves after each record; a window is late once the
// watermark reaches end + lateness; it fires once the watermark reaches its
// end, again after each element it takes after that, and is cleared at end
// + lateness; a record that no window takes is late.
type model struct {
	size, slide, gap int64 // ms; gap > 0 means sessions
	ooo, lateness    int64
	wm               int64
	wmSet            bool
	windows          map[string][]*modelWindow
	out, late        []string
}

type modelWindow struct {
	start, end int64
	r          result
	fired      bool
}

func (m *model) add(e elem) {
	isLate := func(start, end int64) bool { return m.wmSet && end+m.lateness <= m.wm }
	ws := m.windows[e.Key]
	taken := false
	if m.gap > 0 {
		own := &modelWindow{start: e.T, end: e.T + m.gap}
		var keep []*modelWindow
		var hits []*modelWindow
		for _, w := range ws {
			if w.start <= own.end && own.start <= w.end {
				hits = append(hits, w)
			} else {
				keep = append(keep, w)
			}
		}
		if len(hits) > 0 || !isLate(own.start, own.end) {
			for _, h := range hits {
				own.start, own.end = min(own.start, h.start), max(own.end, h.end)
				own.r = sum{}.Merge(own.r, h.r)
			}
			own.r = sum{}.Add(e, own.r)
			ws = append(keep, own)
			taken = true
		}
	} else {
		for start := e.T - e.T%m.slide; start > e.T-m.size; start -= m.slide {
			end := start + m.size
			if isLate(start, end) {
				continue
			}
			taken = true
			var w *modelWindow
			for _, x := range ws {
				if x.start == start {
					w = x
				}
			}
			if w == nil {
				w = &modelWindow{start: start, end: end}
				ws = append(ws, w)
			}
			w.r = sum{}.Add(e, w.r)
			w.fired = false
		}
	}
	m.windows[e.Key] = ws
	if !taken {
		m.late = append(m.late, string(e.value()))
	}
	if w := e.T - m.ooo; !m.wmSet || w > m.wm {
		m.wm, m.wmSet = w, true
	}
	for key, ws := range m.windows {
		var keep []*modelWindow
		for _, w := range ws {
			if !w.fired && w.end <= m.wm {
				m.out = append(m.out, line(key, w.start, w.end, w.r))
				w.fired = true
			}
			if w.end+m.lateness > m.wm {
				keep = append(keep, w)
			}
		}
		m.windows[key] = keep
	}
}

// lateStream is stream with stragglers: one element in eight is up to 16 s
// behind the front, past the out-of-orderness of 2 s and often past the
// lateness too.
func lateStream(seed uint64, n int) []elem {
	rng := rand.New(rand.NewPCG(seed, seed^0x51ed27))
	front := base
	es := make([]elem, n)
	for i := range es {
		front += int64(rng.IntN(3)) * 1000
		behind := int64(rng.IntN(3)) * 1000
		if rng.IntN(8) == 0 {
			behind = int64(rng.IntN(17)) * 1000
		}
		es[i] = elem{Key: "k" + strconv.Itoa(rng.IntN(3)), T: front - behind, V: int64(rng.IntN(100))}
	}
	return es
}

// With stragglers, lateness and a late side output, each window kind and
// function gives what the model gives: the same firings (late ones
// included) and the same late records.
func TestEventTimeLatenessMatchesModel(t *testing.T) {
	t.Parallel()
	const ooo, lateness = 2000, 3000
	kinds := []struct {
		name             string
		assigner         window.Assigner
		size, slide, gap int64
	}{
		{"tumbling", window.TumblingEventTime(10 * time.Second), 10000, 10000, 0},
		{"sliding", window.SlidingEventTime(10*time.Second, 5*time.Second), 10000, 5000, 0},
		{"session", window.EventTimeSession(4500 * time.Millisecond), 0, 0, 4500},
	}
	for i, k := range kinds {
		for _, f := range functions[:2] {
			t.Run(k.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				es := lateStream(uint64(100+i), 300)
				es = append(es, flush(es))
				m := &model{size: k.size, slide: k.slide, gap: k.gap, ooo: ooo, lateness: lateness, windows: map[string][]*modelWindow{}}
				for _, e := range es {
					m.add(e)
				}
				distinct := map[string]bool{}
				for _, l := range m.out {
					distinct[l[:strings.Index(l, ")")]] = true
				}
				if len(m.late) == 0 || len(m.out) == len(distinct) {
					t.Fatalf("the stream exercises too little: %d late records, %d late firings", len(m.late), len(m.out)-len(distinct))
				}
				t.Logf("%d firings, %d of them late; %d late records", len(m.out), len(m.out)-len(distinct), len(m.late))
				h := sluicetest.New(t, mustJob(t, window.Spec[elem, result]{
					Assigner: k.assigner, Function: f.fn, AllowedLateness: lateness * time.Millisecond, LateOutput: late,
				}), sluicetest.Options{MaxOutOfOrderness: ooo * time.Millisecond})
				send(h, es...)
				h.Settle()
				expectSorted(t, "firings", values(h.Output()), m.out)
				expectSorted(t, "late", values(h.SideOutput(late)), m.late)
			})
		}
	}
}
