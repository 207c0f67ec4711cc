package kstate_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

var sweepCases = []conformanceCase{
	{"Sweep/ExpiredAcrossStateTypes", testSweepStateTypes},
	{"Sweep/BoundedByLimit", testSweepBounded},
	{"Sweep/SeesEpochWriteSet", testSweepEpochWriteSet},
	{"Sweep/ReadRefreshKeeps", testSweepReadRefresh},
	{"Sweep/CorruptValue", testSweepCorrupt},
	{"Sweep/Misuse", testSweepMisuse},
}

const sweepTTL = 10 * time.Second

// after is the instant d after the clock of a fresh kstatetest.Scope.
func after(d time.Duration) time.Time { return kstatetest.Epoch.Add(d) }

// entryNames lists the entries the Store holds, write-sets included, as
// "kind name/recordkey[/mapkey]" (timers as "timer"), in key order.
func entryNames(t *testing.T, st *kstate.Store) []string {
	t.Helper()
	var out []string
	must(t, st.Scan(nil, func(k, _ []byte) error {
		d, err := kstate.DecodeKey(k)
		if err != nil {
			return err
		}
		s := fmt.Sprintf("%v %s/%s", d.Kind, d.Name, d.UserKey)
		switch {
		case d.Kind == kstate.KindTimer:
			s = "timer"
		case d.Sub != nil:
			s += "/" + string(d.Sub)
		}
		out = append(out, s)
		return nil
	}))
	return out
}

// sweepAll sweeps from the beginning to the end and returns the entries
// removed and the number of calls it took.
func sweepAll(t *testing.T, st *kstate.Store, now time.Time, limit int) (removed, calls int) {
	t.Helper()
	var cursor []byte
	for {
		next, n, err := kstate.SweepExpired(st, now, cursor, limit)
		if err != nil {
			t.Fatalf("SweepExpired after %d calls: %v", calls, err)
		}
		removed += n
		calls++
		if next == nil {
			return removed, calls
		}
		if calls > 1000 {
			t.Fatal("SweepExpired never reached the end")
		}
		cursor = next
	}
}

// testSweepStateTypes writes every state type with TTL for two record keys
// five seconds apart, plus state without TTL and a timer, and sweeps at the
// instants around each expiry: an entry goes exactly when its expiry is at
// or before now, and nothing without TTL is touched.
func testSweepStateTypes(t *testing.T, kind string) {
	ttl := kstate.WithTTL(sweepTTL, kstate.OnCreateAndWrite)
	v := kstate.Value("v", kstate.Int64(), ttl)
	m := kstate.Map("m", kstate.String(), kstate.Int64(), ttl)
	l := kstate.List("l", kstate.String(), ttl)
	r := kstate.Reducing("r", kstate.Int64(), func(a, b int64) int64 { return a + b }, ttl)
	a := kstate.Aggregating("a", kstate.JSON[avgAcc](), average{}, ttl)
	plain := kstate.Value("plain", kstate.Int64())
	writeAll := func(sc *kstatetest.Scope, mapKey string) {
		must(t, v.Set(sc, 1))
		must(t, m.Put(sc, mapKey, 1))
		must(t, l.Add(sc, "x"))
		must(t, r.Add(sc, 1))
		must(t, a.Add(sc, 1))
		must(t, plain.Set(sc, 1))
	}
	sc := newScope(t, kind).SetKey("old")
	writeAll(sc, "x")
	kstate.RegisterTimer(sc, kstate.EventTime, after(time.Hour))
	sc.Advance(5 * time.Second)
	writeAll(sc.SetKey("new"), "y")
	must(t, m.Put(sc.SetKey("old"), "z", 2)) // a map expires entry by entry
	endEpoch(t, sc)

	var (
		forever = []string{"keyed plain/new", "keyed plain/old", "timer"}
		oldOnes = []string{"keyed-ttl a/old", "keyed-ttl l/old", "keyed-ttl m/old/x", "keyed-ttl r/old", "keyed-ttl v/old"}
		later   = []string{"keyed-ttl a/new", "keyed-ttl l/new", "keyed-ttl m/new/y", "keyed-ttl r/new", "keyed-ttl v/new",
			"keyed-ttl m/old/z"}
	)
	sweeps := []struct {
		name    string
		now     time.Duration
		removed int
		left    [][]string
	}{
		{"a millisecond before the first expiry", sweepTTL - time.Millisecond, 0, [][]string{forever, oldOnes, later}},
		{"at the first expiry", sweepTTL, 5, [][]string{forever, later}},
		{"before the second expiry", 15*time.Second - time.Millisecond, 0, [][]string{forever, later}},
		{"at the second expiry", 15 * time.Second, 6, [][]string{forever}},
		{"much later", time.Hour, 0, [][]string{forever}},
	}
	for _, s := range sweeps {
		removed, _ := sweepAll(t, sc.Store(), after(s.now), 100)
		if removed != s.removed {
			t.Fatalf("%s: removed %d, want %d", s.name, removed, s.removed)
		}
		for _, mut := range sc.Store().Dirty() {
			if k, _ := kstate.DecodeKey(mut.Key); mut.Value != nil || k.Kind != kstate.KindKeyedTTL {
				t.Fatalf("%s: Dirty holds %v %q=%q, want only tombstones of TTL entries", s.name, k.Kind, k.Name, mut.Value)
			}
		}
		got, want := entryNames(t, sc.Store()), slices.Concat(s.left...)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: left %q, want %q", s.name, got, want)
		}
		endEpoch(t, sc)
	}
	if got := sc.Store().Backend().Stats().Keys; got != 3 {
		t.Fatalf("backend keys after the sweeps = %d, want 3", got)
	}
}

// scanCounter counts the entries a backend's scans hand to the Store, which
// is the work a sweep does.
type scanCounter struct {
	kstate.Backend
	visited int
}

func (c *scanCounter) ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error {
	return c.Backend.ScanFrom(prefix, start, func(k, v []byte) error {
		c.visited++
		return fn(k, v)
	})
}

// testSweepBounded proves the cost is bounded by the limit, not by the
// state: N entries with TTL (among as many without, which sort before
// them) take ceil(N/L) calls of at most L+1 backend entries each, and the
// cursor comes back nil at the end, so the next round starts over.
func testSweepBounded(t *testing.T, kind string) {
	tests := []struct {
		n, limit int
		expired  bool
	}{
		{0, 1, true},
		{1, 1, true},
		{7, 1, true},
		{9, 3, true},
		{10, 3, true},
		{10, 10, true},
		{10, 100, true},
		{10, 3, false},
		{50, 7, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("N=%d,L=%d,expired=%v", tt.n, tt.limit, tt.expired), func(t *testing.T) {
			counter := &scanCounter{Backend: mustOpen(t, kind)}
			st := kstate.NewStore(counter)
			sc := kstatetest.NewScope(st)
			ttl := kstate.Value("ttl", kstate.Int64(), kstate.WithTTL(sweepTTL, kstate.OnCreateAndWrite))
			plain := kstate.Value("plain", kstate.Int64())
			for i := range tt.n {
				sc.SetKey(fmt.Sprintf("k%03d", i))
				must(t, ttl.Set(sc, int64(i)))
				must(t, plain.Set(sc, int64(i)))
			}
			endEpoch(t, sc)
			now := after(time.Second)
			if tt.expired {
				now = after(sweepTTL)
			}
			wantCalls := max(1, (tt.n+tt.limit-1)/tt.limit)
			var cursor []byte
			total := 0
			for call := 1; ; call++ {
				counter.visited = 0
				next, removed, err := kstate.SweepExpired(st, now, cursor, tt.limit)
				if err != nil {
					t.Fatal(err)
				}
				if counter.visited > tt.limit+1 {
					t.Fatalf("call %d visited %d backend entries, limit %d", call, counter.visited, tt.limit)
				}
				wantRemoved := 0
				if tt.expired {
					wantRemoved = min(tt.limit, tt.n-(call-1)*tt.limit)
				}
				if removed != wantRemoved {
					t.Fatalf("call %d removed %d, want %d", call, removed, wantRemoved)
				}
				total += removed
				if (next == nil) != (call == wantCalls) {
					t.Fatalf("call %d of %d returned cursor %q", call, wantCalls, next)
				}
				if next == nil {
					break
				}
				cursor = next
			}
			if tt.expired && total != tt.n {
				t.Fatalf("removed %d in all, want %d", total, tt.n)
			}
			// The next round starts over and finds nothing more to do: no
			// entries at all if they expired, the same live ones if not.
			wantEnd := tt.expired || tt.n <= tt.limit
			if next, removed, err := kstate.SweepExpired(st, now, nil, tt.limit); err != nil || removed != 0 || wantEnd != (next == nil) {
				t.Fatalf("second round = %q, %d, %v", next, removed, err)
			}
		})
	}
}

// testSweepEpochWriteSet sweeps entries that sit in the backend and in the
// epoch write-set, interleaved by key, with a backend entry rewritten and
// one deleted in the epoch: the sweep sees the Store's view, and its deletes
// land in the epoch write-set, leaving the record write-set empty.
func testSweepEpochWriteSet(t *testing.T, kind string) {
	v := kstate.Value("v", kstate.Int64(), kstate.WithTTL(sweepTTL, kstate.OnCreateAndWrite))
	sc := newScope(t, kind)
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	for i := 0; i < 10; i += 2 {
		must(t, v.Set(sc.SetKey(key(i)), 1))
	}
	endEpoch(t, sc)
	for i := 1; i < 10; i += 2 {
		must(t, v.Set(sc.SetKey(key(i)), 1))
	}
	sc.Advance(5 * time.Second)
	must(t, v.Set(sc.SetKey("k2"), 2)) // a backend entry with a later expiry
	must(t, v.Clear(sc.SetKey("k4")))  // a backend entry deleted in the epoch
	sc.Store().CommitRecord()

	removed, calls := sweepAll(t, sc.Store(), after(sweepTTL), 3)
	if removed != 8 || calls != 3 {
		t.Fatalf("removed %d in %d calls, want 8 in 3 (the epoch's delete of k4 is not an entry)", removed, calls)
	}
	var dirty []string
	for _, mut := range sc.Store().Dirty() {
		k, _ := kstate.DecodeKey(mut.Key)
		state := "deleted"
		if mut.Value != nil {
			state = "set"
		}
		dirty = append(dirty, string(k.UserKey)+" "+state)
	}
	want := []string{"k0 deleted", "k1 deleted", "k2 set", "k3 deleted", "k4 deleted", "k5 deleted",
		"k6 deleted", "k7 deleted", "k8 deleted", "k9 deleted"}
	if !slices.Equal(dirty, want) {
		t.Fatalf("Dirty = %q, want %q", dirty, want)
	}
	// Nothing was left in the record write-set: a rollback changes nothing,
	// and another sweep (which refuses a record in flight) runs.
	sc.Store().RollbackRecord()
	if n := sc.Store().DirtyLen(); n != len(want) {
		t.Fatalf("DirtyLen after rollback = %d, want %d", n, len(want))
	}
	if _, _, err := kstate.SweepExpired(sc.Store(), after(sweepTTL), nil, 3); err != nil {
		t.Fatalf("sweep after a sweep: %v", err)
	}
	endEpoch(t, sc)
	if got := entryNames(t, sc.Store()); !slices.Equal(got, []string{"keyed-ttl v/k2"}) {
		t.Fatalf("after the epoch: %q", got)
	}
}

// testSweepReadRefresh: with OnReadAndWrite a read pushes the expiry out,
// so an entry read recently survives a sweep that would have removed it,
// whether the refresh is still in the epoch write-set or already applied.
func testSweepReadRefresh(t *testing.T, kind string) {
	tests := []struct {
		name    string
		update  kstate.TTLUpdate
		applied bool // the epoch of the read is applied before the sweep
		removed int  // at 13s; the read at 8s makes OnReadAndWrite last to 18s
	}{
		{"create-and-write, read in the epoch", kstate.OnCreateAndWrite, false, 1},
		{"read-and-write, read in the epoch", kstate.OnReadAndWrite, false, 0},
		{"read-and-write, read applied", kstate.OnReadAndWrite, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := kstate.Value("v", kstate.Int64(), kstate.WithTTL(sweepTTL, tt.update))
			sc := newScope(t, kind)
			must(t, v.Set(sc, 1))
			endEpoch(t, sc)
			sc.Advance(8 * time.Second)
			wantValue(t, v.Get, sc, 1, true)
			sc.Store().CommitRecord()
			if tt.applied {
				endEpoch(t, sc)
			}
			if _, removed, err := kstate.SweepExpired(sc.Store(), after(13*time.Second), nil, 10); err != nil || removed != tt.removed {
				t.Fatalf("sweep at 13s removed %d, %v; want %d", removed, err, tt.removed)
			}
			if tt.removed == 0 {
				if _, removed, err := kstate.SweepExpired(sc.Store(), after(18*time.Second), nil, 10); err != nil || removed != 1 {
					t.Fatalf("sweep at 18s removed %d, %v; want 1", removed, err)
				}
			}
		})
	}
}

// testSweepCorrupt: a value under KindKeyedTTL too short for the expiry is
// reported, naming the key, and the sweep deletes nothing, not even the
// expired entry it met before it.
func testSweepCorrupt(t *testing.T, kind string) {
	tests := []struct {
		name    string
		value   string
		applied bool
	}{
		{"empty in the backend", "", true},
		{"short in the backend", "abc", true},
		{"seven bytes in the epoch write-set", "1234567", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := kstate.Value("a", kstate.Int64(), kstate.WithTTL(sweepTTL, kstate.OnCreateAndWrite))
			sc := newScope(t, kind)
			must(t, v.Set(sc, 1)) // sorts before "bad", and expires
			bad := kstate.EncodeKey(kstate.KindKeyedTTL, "bad", []byte("k1"), nil)
			sc.Store().Put(bad, []byte(tt.value))
			sc.Store().CommitRecord()
			if tt.applied {
				endEpoch(t, sc)
			}
			dirty := sc.Store().DirtyLen()
			cursor := kstate.EncodeKey(kstate.KindKeyedTTL, "", nil, nil)
			next, removed, err := kstate.SweepExpired(sc.Store(), after(time.Hour), cursor, 10)
			if !errors.Is(err, kstate.ErrCorrupt) || !strings.Contains(err.Error(), `"bad"`) || !strings.Contains(err.Error(), `"k1"`) {
				t.Fatalf("SweepExpired = %v, want ErrCorrupt naming state \"bad\" and key \"k1\"", err)
			}
			if removed != 0 || !bytes.Equal(next, cursor) {
				t.Fatalf("on error: removed %d, next %q; want 0 and the caller's cursor", removed, next)
			}
			if sc.Store().DirtyLen() != dirty || sc.Store().RecordErr() != nil {
				t.Fatal("a failed sweep changed the write-sets")
			}
			wantGet(t, sc.Store(), string(bad), []byte(tt.value))
		})
	}
}

func testSweepMisuse(t *testing.T, kind string) {
	tests := []struct {
		name  string
		setup func(st *kstate.Store)
		limit int
	}{
		{"record in flight", func(st *kstate.Store) { st.Put([]byte("pending"), []byte("1")) }, 10},
		{"failed record in flight", func(st *kstate.Store) { st.Put(nil, []byte("1")) }, 10},
		{"zero limit", func(*kstate.Store) {}, 0},
		{"negative limit", func(*kstate.Store) {}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := kstate.Value("v", kstate.Int64(), kstate.WithTTL(sweepTTL, kstate.OnCreateAndWrite))
			sc := newScope(t, kind)
			must(t, v.Set(sc, 1))
			endEpoch(t, sc)
			tt.setup(sc.Store())
			if _, removed, err := kstate.SweepExpired(sc.Store(), after(time.Hour), nil, tt.limit); err == nil || removed != 0 {
				t.Fatalf("SweepExpired = %d, %v; want an error", removed, err)
			}
			if n := sc.Store().DirtyLen(); n != 0 {
				t.Fatalf("a refused sweep committed %d keys", n)
			}
		})
	}
}
