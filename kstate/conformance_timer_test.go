package kstate_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

var timerCases = []conformanceCase{
	{"Timers/DueOrderAndBounds", testTimersDue},
	{"Timers/DeleteRemoveRollback", testTimersDelete},
	{"Timers/NextTimer", testNextTimer},
}

func at(sec int) time.Time { return kstatetest.Epoch.Add(time.Duration(sec) * time.Second) }

// timerStrings renders timers as "key@second" relative to kstatetest.Epoch.
func timerStrings(ts []kstate.Timer) []string {
	var out []string
	for _, tm := range ts {
		out = append(out, fmt.Sprintf("%s@%d", tm.Key, tm.At.Sub(kstatetest.Epoch)/time.Second))
	}
	return out
}

func wantDue(t *testing.T, st *kstate.Store, d kstate.TimeDomain, upTo time.Time, want ...string) {
	t.Helper()
	ts, err := kstate.DueTimers(st, d, upTo, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tm := range ts {
		if tm.Domain != d {
			t.Fatalf("DueTimers(%v) returned a %v timer", d, tm.Domain)
		}
	}
	if got := timerStrings(ts); !slices.Equal(got, want) {
		t.Fatalf("DueTimers(%v, %v) = %q, want %q", d, upTo.Sub(kstatetest.Epoch), got, want)
	}
}

func testTimersDue(t *testing.T, kind string) {
	sc := newScope(t, kind)
	st := sc.Store()
	reg := []struct {
		key string
		d   kstate.TimeDomain
		sec int
	}{
		{"b", kstate.EventTime, 5}, {"a", kstate.EventTime, 5}, {"a", kstate.EventTime, 1},
		{"c", kstate.EventTime, 10}, {"a", kstate.ProcessingTime, 2}, {"a", kstate.EventTime, 5}, // duplicate
		{"", kstate.EventTime, 3},
	}
	for i, r := range reg {
		sc.SetKey(r.key)
		kstate.RegisterTimer(sc, r.d, at(r.sec))
		if i == 3 {
			endEpoch(t, sc) // some timers come from the backend, some from the write-set
		}
	}
	st.CommitRecord()
	wantDue(t, st, kstate.EventTime, at(0))
	wantDue(t, st, kstate.EventTime, at(5), "a@1", "@3", "a@5", "b@5") // upTo is inclusive
	wantDue(t, st, kstate.EventTime, at(100), "a@1", "@3", "a@5", "b@5", "c@10")
	wantDue(t, st, kstate.ProcessingTime, at(100), "a@2")
	endEpoch(t, sc)
	wantDue(t, st, kstate.EventTime, at(9), "a@1", "@3", "a@5", "b@5")

	// Milliseconds are kept; anything finer is dropped.
	sc.SetKey("ms")
	kstate.RegisterTimer(sc, kstate.ProcessingTime, at(20).Add(1500*time.Microsecond))
	ts, err := kstate.DueTimers(st, kstate.ProcessingTime, at(21), 0)
	if err != nil || len(ts) != 2 || !ts[1].At.Equal(at(20).Add(time.Millisecond)) || !bytes.Equal(ts[1].Key, []byte("ms")) {
		t.Fatalf("DueTimers = %+v, %v", ts, err)
	}
	if _, err := kstate.DueTimers(st, 9, at(0), 0); err == nil {
		t.Fatal("DueTimers with an invalid domain did not fail")
	}
}

func testTimersDelete(t *testing.T, kind string) {
	sc := newScope(t, kind)
	st := sc.Store()
	for _, k := range []string{"a", "b", "c"} {
		sc.SetKey(k)
		kstate.RegisterTimer(sc, kstate.EventTime, at(1))
	}
	endEpoch(t, sc)
	sc.SetKey("a")
	kstate.DeleteTimer(sc, kstate.EventTime, at(1))
	kstate.DeleteTimer(sc, kstate.EventTime, at(2)) // not registered: no effect
	kstate.DeleteTimer(sc, kstate.ProcessingTime, at(1))
	st.CommitRecord()
	wantDue(t, st, kstate.EventTime, at(1), "b@1", "c@1")

	// Firing: the runtime removes each timer it fires, as part of a record.
	due, err := kstate.DueTimers(st, kstate.EventTime, at(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	kstate.RemoveTimer(st, due[0])
	st.CommitRecord()
	kstate.RemoveTimer(st, due[1])
	st.RollbackRecord() // the timer's handler failed: it stays registered
	wantDue(t, st, kstate.EventTime, at(1), "c@1")
	endEpoch(t, sc)
	wantDue(t, st, kstate.EventTime, at(1), "c@1")
	if s := st.Backend().Stats(); s.Keys != 1 {
		t.Fatalf("backend keys = %d, want 1", s.Keys)
	}
	err = st.Backend().Scan(nil, func(k, v []byte) error {
		tm, err := kstate.DecodeTimer(k)
		if err != nil || string(tm.Key) != "c" || len(v) != 0 {
			return fmt.Errorf("stored timer %x=%x decodes to %+v, %v", k, v, tm, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testNextTimer(t *testing.T, kind string) {
	sc := newScope(t, kind)
	st := sc.Store()
	if _, ok, err := kstate.NextTimer(st, kstate.ProcessingTime); ok || err != nil {
		t.Fatalf("NextTimer on empty store = %v, %v", ok, err)
	}
	kstate.RegisterTimer(sc, kstate.ProcessingTime, at(7))
	endEpoch(t, sc)
	kstate.RegisterTimer(sc, kstate.ProcessingTime, at(3))
	kstate.RegisterTimer(sc, kstate.EventTime, at(1))
	tm, ok, err := kstate.NextTimer(st, kstate.ProcessingTime)
	if err != nil || !ok || !tm.At.Equal(at(3)) || tm.Domain != kstate.ProcessingTime {
		t.Fatalf("NextTimer = %+v, %v, %v; want the one at 3s", tm, ok, err)
	}
	_, _, err = kstate.NextTimer(st, 0)
	if err == nil {
		t.Fatal("NextTimer with an invalid domain did not fail")
	}
	if _, err := kstate.DecodeTimer(kstate.EncodeKey(kstate.KindKeyed, "x", nil, nil)); !errors.Is(err, kstate.ErrBadKey) {
		t.Fatalf("DecodeTimer of a keyed key = %v, want ErrBadKey", err)
	}
}
