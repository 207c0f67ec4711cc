package kstate_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// backends is every backend the conformance suite runs against. A new
// backend is added here and must pass everything below unchanged.
var backends = []string{kstate.MemoryBackend, kstate.BoltBackend}

// conformanceCase is one behaviour every backend, and the Store and state
// types over it, must show.
type conformanceCase struct {
	name string
	run  func(t *testing.T, kind string)
}

// TestConformance runs the whole suite once per backend. The cases live in
// the conformance_*_test.go files, grouped by layer.
func TestConformance(t *testing.T) {
	var suite []conformanceCase
	suite = append(suite, backendCases...)
	suite = append(suite, storeCases...)
	suite = append(suite, stateCases...)
	suite = append(suite, timerCases...)
	suite = append(suite, sweepCases...)
	for _, kind := range backends {
		t.Run(kind, func(t *testing.T) {
			for _, c := range suite {
				t.Run(c.name, func(t *testing.T) { c.run(t, kind) })
			}
		})
	}
}

// mustOpen opens a backend of kind in t.TempDir() and checks it on cleanup.
func mustOpen(t *testing.T, kind string) kstate.Backend {
	t.Helper()
	return kstatetest.MustOpen(t, kind)
}

func put(k, v string) kstate.Mutation { return kstate.Mutation{Key: []byte(k), Value: []byte(v)} }
func del(k string) kstate.Mutation    { return kstate.Mutation{Key: []byte(k)} }

func mustApply(t *testing.T, b kstate.Backend, meta kstate.Meta, muts ...kstate.Mutation) {
	t.Helper()
	if err := b.Apply(muts, meta); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// scanner is what Backend and Store have in common for reading in order.
type scanner interface {
	Scan(prefix []byte, fn func(k, v []byte) error) error
	ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error
}

// scanAll returns "key=value" for every entry under prefix, in scan order.
func scanAll(t *testing.T, s scanner, prefix string) []string {
	t.Helper()
	var out []string
	err := s.Scan([]byte(prefix), func(k, v []byte) error {
		out = append(out, string(k)+"="+string(v))
		return nil
	})
	if err != nil {
		t.Fatalf("Scan(%q): %v", prefix, err)
	}
	return out
}

// scanFromAll is scanAll from start.
func scanFromAll(t *testing.T, s scanner, prefix, start string) []string {
	t.Helper()
	var out []string
	err := s.ScanFrom([]byte(prefix), []byte(start), func(k, v []byte) error {
		out = append(out, string(k)+"="+string(v))
		return nil
	})
	if err != nil {
		t.Fatalf("ScanFrom(%q, %q): %v", prefix, start, err)
	}
	return out
}

// fromStart keeps the "key=value" entries of a sorted scan whose key is >=
// start: what ScanFrom must return, given what Scan returns.
func fromStart(entries []string, start string) []string {
	var out []string
	for _, e := range entries {
		if k, _, _ := strings.Cut(e, "="); k >= start {
			out = append(out, e)
		}
	}
	return out
}

type getter interface {
	Get(key []byte) ([]byte, bool, error)
}

// wantGet checks one key: want is the value, or nil for "absent".
func wantGet(t *testing.T, g getter, key string, want []byte) {
	t.Helper()
	got, ok, err := g.Get([]byte(key))
	switch {
	case err != nil:
		t.Fatalf("Get(%q): %v", key, err)
	case want == nil && ok:
		t.Fatalf("Get(%q) = %q, want absent", key, got)
	case want != nil && !ok:
		t.Fatalf("Get(%q) absent, want %q", key, want)
	case want != nil && !bytes.Equal(got, want):
		t.Fatalf("Get(%q) = %q, want %q", key, got, want)
	}
}

var backendCases = []conformanceCase{
	{"Backend/GetApplyDelete", testBackendGetApplyDelete},
	{"Backend/GetReturnsOwnedCopy", testBackendGetOwnedCopy},
	{"Backend/ScanOrderAndPrefixes", testBackendScan},
	{"Backend/ScanStopAndErrors", testBackendScanStop},
	{"Backend/ScanFromPositions", testBackendScanFrom},
	{"Backend/ScanFromStopAndErrors", testBackendScanFromStop},
	{"Backend/ApplyLastWins", testBackendApplyLastWins},
	{"Backend/ApplyRejectsBadKeysAtomically", testBackendApplyBadKeys},
	{"Backend/MetaRoundTrip", testBackendMeta},
	{"Backend/StatsExact", testBackendStats},
	{"Backend/StatsTimers", testBackendTimerStats},
	{"Backend/ReopenPreservesDataAndMeta", testBackendReopen},
	{"Backend/ConcurrentReadersDuringApply", testBackendConcurrentReaders},
	{"Backend/Closed", testBackendClosed},
}

func testBackendGetApplyDelete(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	wantGet(t, b, "a", nil)
	mustApply(t, b, kstate.Meta{}, put("a", "1"), put("empty", ""), put("c", "3"))
	wantGet(t, b, "a", []byte("1"))
	wantGet(t, b, "empty", []byte{}) // an empty value is a value, not a delete
	wantGet(t, b, "c", []byte("3"))
	wantGet(t, b, "z", nil)
	mustApply(t, b, kstate.Meta{}, put("a", "2"), del("c"), del("never-there"))
	wantGet(t, b, "a", []byte("2"))
	wantGet(t, b, "c", nil)
	if v, ok, _ := b.Get([]byte("empty")); !ok || v == nil {
		t.Fatalf("Get(empty) = %v, %v; want a non-nil empty value", v, ok)
	}
}

func testBackendGetOwnedCopy(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, put("a", "one"))
	v, _, err := b.Get([]byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, b, kstate.Meta{}, put("a", "two"), put("b", strings.Repeat("x", 5000)))
	if string(v) != "one" {
		t.Fatalf("value kept from Get changed to %q after a later Apply", v)
	}
	v[0] = 'X'
	wantGet(t, b, "a", []byte("two"))
	muts := []kstate.Mutation{put("m", "mine")}
	mustApply(t, b, kstate.Meta{}, muts...)
	muts[0].Value[0] = 'X' // the caller's buffer is the caller's again
	wantGet(t, b, "m", []byte("mine"))
}

var scanKeys = []string{"a", "ab", "abc", "b", "ba", "\x00", "\x00\x00", "\xff", "\xff\xff", "a\xff", "a\x00"}

func testBackendScan(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	var muts []kstate.Mutation
	for _, k := range scanKeys {
		muts = append(muts, put(k, "v"+k))
	}
	mustApply(t, b, kstate.Meta{}, muts...)
	for _, prefix := range []string{"", "a", "ab", "abc", "abcd", "b", "c", "\x00", "\xff", "\xff\xff\xff", "a\x00"} {
		t.Run(fmt.Sprintf("%q", prefix), func(t *testing.T) {
			var want []string
			for _, k := range slices.Sorted(slices.Values(scanKeys)) {
				if strings.HasPrefix(k, prefix) {
					want = append(want, k+"=v"+k)
				}
			}
			if got := scanAll(t, b, prefix); !slices.Equal(got, want) {
				t.Fatalf("Scan(%q) = %q, want %q", prefix, got, want)
			}
		})
	}
}

func testBackendScanStop(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, put("a", "1"), put("b", "2"), put("c", "3"))
	n := 0
	err := b.Scan(nil, func(k, v []byte) error {
		n++
		if n == 2 {
			return kstate.ErrStopScan
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Fatalf("stopped scan = %v after %d entries, want nil after 2", err, n)
	}
	boom := errors.New("boom")
	if err := b.Scan(nil, func(k, v []byte) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Scan = %v, want the callback's error", err)
	}
	// A callback may read the same backend.
	err = b.Scan(nil, func(k, v []byte) error {
		got, ok, err := b.Get(k)
		if err != nil || !ok || !bytes.Equal(got, v) {
			return fmt.Errorf("nested Get(%q) = %q, %v, %v", k, got, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// testBackendScanFrom checks every way a start can sit against a prefix's
// range: before it, at it, on a key, between keys, on the last key, past
// the range while keys follow it, and past every key.
func testBackendScanFrom(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	var muts []kstate.Mutation
	for _, k := range scanKeys {
		muts = append(muts, put(k, "v"+k))
	}
	mustApply(t, b, kstate.Meta{}, muts...)
	tests := []struct {
		name, prefix, start string
	}{
		{"whole range from nothing", "", ""},
		{"whole range from a key", "", "ab"},
		{"whole range from between keys", "", "aa"},
		{"whole range past every key", "", "\xff\xff\xff"},
		{"start empty before prefix", "a", ""},
		{"start before prefix", "a", "\x00\x00\x00"},
		{"start at prefix", "a", "a"},
		{"start on a key", "a", "ab"},
		{"start between keys", "a", "abb"},
		{"start on the last key", "a", "a\xff"},
		{"start past the range", "a", "a\xff\x00"},
		{"start on the next range", "a", "b"},
		{"start after prefix in a short range", "ab", "abc"},
		{"start in the top range", "\xff", "\xff\x00"},
		{"empty range", "c", "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []string
			for _, k := range slices.Sorted(slices.Values(scanKeys)) {
				if strings.HasPrefix(k, tt.prefix) && k >= tt.start {
					want = append(want, k+"=v"+k)
				}
			}
			if got := scanFromAll(t, b, tt.prefix, tt.start); !slices.Equal(got, want) {
				t.Fatalf("ScanFrom(%q, %q) = %q, want %q", tt.prefix, tt.start, got, want)
			}
		})
	}
	// A nil start is the prefix's beginning, as Scan is.
	var got []string
	must(t, b.ScanFrom([]byte("a"), nil, func(k, v []byte) error {
		got = append(got, string(k))
		return nil
	}))
	if want := []string{"a", "a\x00", "ab", "abc", "a\xff"}; !slices.Equal(got, want) {
		t.Fatalf("ScanFrom(a, nil) = %q, want %q", got, want)
	}
}

func testBackendScanFromStop(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, put("a", "1"), put("b", "2"), put("c", "3"), put("d", "4"))
	var seen []string
	err := b.ScanFrom(nil, []byte("b"), func(k, v []byte) error {
		seen = append(seen, string(k))
		if len(seen) == 2 {
			return kstate.ErrStopScan
		}
		return nil
	})
	if err != nil || !slices.Equal(seen, []string{"b", "c"}) {
		t.Fatalf("stopped ScanFrom = %v after %q, want nil after [b c]", err, seen)
	}
	boom := errors.New("boom")
	if err := b.ScanFrom(nil, []byte("c"), func(k, v []byte) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("ScanFrom = %v, want the callback's error", err)
	}
	// A callback may read the same backend.
	err = b.ScanFrom(nil, []byte("bb"), func(k, v []byte) error {
		got, ok, err := b.Get(k)
		if err != nil || !ok || !bytes.Equal(got, v) {
			return fmt.Errorf("nested Get(%q) = %q, %v, %v", k, got, ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testBackendApplyLastWins(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, put("d", "old"))
	mustApply(t, b, kstate.Meta{},
		put("c", "1"), put("a", "1"), put("c", "2"), del("a"), put("b", "1"), del("d"), put("a", "3"), del("c"))
	if got, want := scanAll(t, b, ""), []string{"a=3", "b=1"}; !slices.Equal(got, want) {
		t.Fatalf("after Apply: %q, want %q", got, want)
	}
	if s := b.Stats(); s.Keys != 2 {
		t.Fatalf("Stats().Keys = %d, want 2", s.Keys)
	}
}

func testBackendApplyBadKeys(t *testing.T, kind string) {
	tests := []struct {
		name string
		bad  kstate.Mutation
	}{
		{"empty key", put("", "v")},
		{"empty key delete", del("")},
		{"key over MaxKeySize", put(strings.Repeat("k", kstate.MaxKeySize+1), "v")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustOpen(t, kind)
			before := kstate.Meta{Epoch: 1, Offsets: map[string]int64{"in": 10}}
			mustApply(t, b, before, put("x", "1"))
			err := b.Apply([]kstate.Mutation{put("a", "1"), tt.bad, put("x", "2")},
				kstate.Meta{Epoch: 2, Offsets: map[string]int64{"in": 20}})
			if !errors.Is(err, kstate.ErrBadKey) {
				t.Fatalf("Apply = %v, want ErrBadKey", err)
			}
			// Nothing of the batch landed: neither entries nor meta.
			wantGet(t, b, "a", nil)
			wantGet(t, b, "x", []byte("1"))
			if m, _ := b.Meta(); m.Epoch != 1 || m.Offsets["in"] != 10 {
				t.Fatalf("meta after failed Apply = %+v, want epoch 1", m)
			}
		})
	}
	b := mustOpen(t, kind)
	longest := strings.Repeat("k", kstate.MaxKeySize)
	mustApply(t, b, kstate.Meta{}, put(longest, "v"))
	wantGet(t, b, longest, []byte("v"))
}

func testBackendMeta(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	m, err := b.Meta()
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != 0 || m.ChangelogOffset != 0 || m.Offsets == nil || len(m.Offsets) != 0 {
		t.Fatalf("fresh Meta = %+v, want zero with an empty Offsets map", m)
	}
	in := kstate.Meta{Epoch: 7, ChangelogOffset: 1234, Offsets: map[string]int64{"orders": 99, "payments": 0}}
	mustApply(t, b, in, put("k", "v"))
	in.Offsets["orders"] = -5 // the backend must have copied the map
	got, err := b.Meta()
	if err != nil {
		t.Fatal(err)
	}
	want := kstate.Meta{Epoch: 7, ChangelogOffset: 1234, Offsets: map[string]int64{"orders": 99, "payments": 0}}
	if got.Epoch != want.Epoch || got.ChangelogOffset != want.ChangelogOffset || !maps.Equal(got.Offsets, want.Offsets) {
		t.Fatalf("Meta = %+v, want %+v", got, want)
	}
	got.Offsets["orders"] = 1 // and hands out a copy
	if again, _ := b.Meta(); again.Offsets["orders"] != 99 {
		t.Fatal("Meta's map is shared with the backend")
	}
	// An Apply with no mutations still advances the meta (an idle epoch).
	mustApply(t, b, kstate.Meta{Epoch: 8, ChangelogOffset: -1})
	if m, _ := b.Meta(); m.Epoch != 8 || m.ChangelogOffset != -1 || len(m.Offsets) != 0 {
		t.Fatalf("Meta after empty Apply = %+v", m)
	}
	wantGet(t, b, "k", []byte("v"))
}

func testBackendStats(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	steps := []struct {
		name      string
		muts      []kstate.Mutation
		keys, byt int64
	}{
		{"fresh", nil, 0, 0},
		{"insert", []kstate.Mutation{put("a", "12"), put("bb", ""), put("c", "1")}, 3, 3 + 2 + 2},
		{"overwrite", []kstate.Mutation{put("a", "1234")}, 3, 5 + 2 + 2},
		{"delete", []kstate.Mutation{del("bb")}, 2, 5 + 2},
		{"delete missing", []kstate.Mutation{del("zz")}, 2, 7},
		{"duplicates", []kstate.Mutation{put("d", "1"), put("d", "22"), del("c")}, 2, 5 + 3},
		{"reinsert", []kstate.Mutation{put("c", "")}, 3, 9},
		// Every key after the last one held: bbolt takes them as an
		// append, without looking each one up.
		{"append", []kstate.Mutation{put("x", "1"), del("xa"), put("y", "12")}, 5, 14},
		{"append from the last key", []kstate.Mutation{put("y", "1"), put("yy", "")}, 6, 15},
		{"an overwrite and a key past the last", []kstate.Mutation{put("c", "12"), put("yz", "1")}, 7, 20},
	}
	for _, s := range steps {
		mustApply(t, b, kstate.Meta{}, s.muts...)
		if got := b.Stats(); got.Keys != s.keys || got.Bytes != s.byt {
			t.Fatalf("%s: Stats = %+v, want {Keys:%d Bytes:%d}", s.name, got, s.keys, s.byt)
		}
	}
}

// Stats counts timer entries per domain through inserts, overwrites and
// deletes, and across a reopen.
func testBackendTimerStats(t *testing.T, kind string) {
	dir := t.TempDir()
	b := kstatetest.MustOpenDir(t, kind, dir)
	timer := func(d kstate.TimeDomain, s int64, key string) []byte {
		return kstate.TimerKey(kstate.Timer{Domain: d, At: time.Unix(s, 0), Key: []byte(key)})
	}
	e1, e2, p1 := timer(kstate.EventTime, 1, "a"), timer(kstate.EventTime, 2, "a"), timer(kstate.ProcessingTime, 1, "a")
	steps := []struct {
		name              string
		muts              []kstate.Mutation
		event, processing int64
	}{
		{"register", []kstate.Mutation{{Key: e1, Value: []byte{}}, {Key: e2, Value: []byte{}}, {Key: p1, Value: []byte{}}, put("x", "1")}, 2, 1},
		{"register again", []kstate.Mutation{{Key: e1, Value: []byte{}}}, 2, 1},
		{"fire", []kstate.Mutation{{Key: e1}, {Key: p1}, del("x")}, 1, 0},
		{"delete missing", []kstate.Mutation{{Key: p1}}, 1, 0},
	}
	for _, s := range steps {
		mustApply(t, b, kstate.Meta{}, s.muts...)
		if got := b.Stats(); got.EventTimers != s.event || got.ProcessingTimers != s.processing || got.Timers(kstate.EventTime) != s.event {
			t.Fatalf("%s: Stats = %+v, want %d event and %d processing timers", s.name, got, s.event, s.processing)
		}
	}
	if kind == kstate.MemoryBackend {
		return
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = kstatetest.MustOpenDir(t, kind, dir)
	if got := b.Stats(); got.EventTimers != 1 || got.ProcessingTimers != 0 {
		t.Fatalf("after reopen: Stats = %+v", got)
	}
}

func testBackendReopen(t *testing.T, kind string) {
	if kind == kstate.MemoryBackend {
		t.Skip("the memory backend keeps nothing across Close by design")
	}
	dir := t.TempDir()
	b := kstatetest.MustOpenDir(t, kind, dir)
	meta := kstate.Meta{Epoch: 3, ChangelogOffset: 77, Offsets: map[string]int64{"in": 42}}
	mustApply(t, b, meta, put("a", "1"), put("b", "2"), put("c", ""))
	mustApply(t, b, meta, del("b"))
	stats := b.Stats()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := kstatetest.CheckBolt(kstate.BoltPath(dir, kstatetest.Task)); err != nil {
		t.Fatal(err)
	}
	b = kstatetest.MustOpenDir(t, kind, dir)
	if got := scanAll(t, b, ""); !slices.Equal(got, []string{"a=1", "c="}) {
		t.Fatalf("after reopen: %q", got)
	}
	if m, err := b.Meta(); err != nil || m.Epoch != 3 || m.ChangelogOffset != 77 || m.Offsets["in"] != 42 {
		t.Fatalf("Meta after reopen = %+v, %v", m, err)
	}
	if got := b.Stats(); got != stats {
		t.Fatalf("Stats after reopen = %+v, want %+v", got, stats)
	}
}

// Metrics and savepoint exports read a backend from other goroutines while
// its task applies epochs; run with -race this proves that is safe, and each
// reader must see whole epochs: every key of an epoch carries one value.
func testBackendConcurrentReaders(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	const epochs, keys = 50, 20
	apply := func(e int) {
		muts := make([]kstate.Mutation, keys)
		for i := range muts {
			muts[i] = put(fmt.Sprintf("k%02d", i), fmt.Sprint(e))
		}
		mustApply(t, b, kstate.Meta{Epoch: uint64(e)}, muts...)
	}
	apply(0)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	done := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			_ = b.Stats()
			if _, err := b.Meta(); err != nil {
				errs <- err
				return
			}
			// A Get beside an Apply (the engine's reads while its
			// apply runs behind) sees the entry of some epoch whole.
			if v, ok, err := b.Get([]byte("k07")); err != nil || !ok || len(v) == 0 {
				if err == nil {
					err = fmt.Errorf("Get(k07) = %q, %v beside an Apply, want a value", v, ok)
				}
				errs <- err
				return
			}
			if _, ok, err := b.Get([]byte("zz")); err != nil || ok {
				errs <- fmt.Errorf("Get(zz) = %v, %v beside an Apply, want absent", ok, err)
				return
			}
			seen := map[string]bool{}
			err := b.Scan([]byte("k"), func(k, v []byte) error {
				seen[string(v)] = true
				return nil
			})
			if err == nil && len(seen) != 1 {
				err = fmt.Errorf("one scan saw values of several epochs: %v", seen)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	})
	for e := 1; e <= epochs; e++ {
		apply(e)
	}
	close(done)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

func testBackendClosed(t *testing.T, kind string) {
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, put("a", "1"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	ops := map[string]error{}
	_, _, ops["Get"] = b.Get([]byte("a"))
	ops["Scan"] = b.Scan(nil, func(k, v []byte) error { return nil })
	ops["ScanFrom"] = b.ScanFrom(nil, []byte("a"), func(k, v []byte) error { return nil })
	ops["Apply"] = b.Apply([]kstate.Mutation{put("b", "1")}, kstate.Meta{})
	_, ops["Meta"] = b.Meta()
	for op, err := range ops {
		if !errors.Is(err, kstate.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", op, err)
		}
	}
}
