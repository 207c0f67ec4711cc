package sluice

import (
	"testing"
	"time"
)

func TestEventClock(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		topic string // "" = no record: only time passes
		ts    int    // record timestamp, seconds after t0
		now   int    // processing time, seconds after t0
		want  int    // watermark after the step, seconds after t0; -1 = none
	}
	for _, tc := range []struct {
		name   string
		topics []string
		ooo    time.Duration
		idle   time.Duration
		steps  []step
	}{
		{"one topic follows the max", []string{"a"}, 0, 0, []step{
			{"a", 5, 0, 5}, {"a", 3, 0, 5}, {"a", 9, 0, 9},
		}},
		{"out of orderness trails the max", []string{"a"}, 2 * time.Second, 0, []step{
			{"a", 5, 0, 3}, {"a", 6, 0, 4}, {"a", 1, 0, 4},
		}},
		{"two topics: the slower holds back", []string{"a", "b"}, 0, 0, []step{
			{"a", 5, 0, -1}, {"b", 3, 0, 3}, {"a", 9, 0, 3}, {"b", 7, 0, 7},
		}},
		{"an idle topic stops holding back", []string{"a", "b"}, 0, 10 * time.Second, []step{
			{"a", 5, 1, -1}, {"", 0, 9, -1}, {"", 0, 10, 5}, {"a", 8, 11, 8},
			// b comes back behind the watermark: it holds the max back, never the watermark.
			{"b", 2, 12, 8}, {"a", 20, 13, 8}, {"b", 15, 14, 15},
		}},
		{"idle does nothing for one topic", []string{"a"}, 0, time.Second, []step{
			{"a", 5, 0, 5}, {"", 0, 100, 5}, {"a", 8, 200, 8},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newEventClock(tc.topics, tc.ooo, tc.idle, time.Time{}, t0)
			for i, s := range tc.steps {
				if s.topic == "" {
					c.advance(at(s.now))
				} else {
					c.observe(s.topic, at(s.ts), at(s.now))
				}
				want := time.Time{}
				if s.want >= 0 {
					want = at(s.want)
				}
				if got := c.watermark(); !got.Equal(want) {
					t.Fatalf("step %d %+v: watermark %v, want %v", i, s, got, want)
				}
			}
		})
	}
}

// The watermark is part of the epoch: an abort takes it back, a commit
// keeps it, and a restart resumes from the committed one, never lower.
func TestEventClockEpochs(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	c := newEventClock([]string{"a"}, 0, 0, t0.Add(10*time.Second), t0)
	if c.observe("a", t0.Add(5*time.Second), t0) || !c.watermark().Equal(t0.Add(10*time.Second)) {
		t.Fatalf("a restored watermark moved back to %v", c.watermark())
	}
	c.observe("a", t0.Add(20*time.Second), t0)
	c.commit()
	c.observe("a", t0.Add(30*time.Second), t0)
	c.rewind()
	if !c.watermark().Equal(t0.Add(20 * time.Second)) {
		t.Fatalf("after the abort: %v, want the committed 20s", c.watermark())
	}
	// The replay sees the same maxima: the record at 25 moves it again.
	if !c.observe("a", t0.Add(25*time.Second), t0) || !c.watermark().Equal(t0.Add(25*time.Second)) {
		t.Fatalf("replay: %v", c.watermark())
	}
}
