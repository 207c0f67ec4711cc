package kstate_test

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

var storeCases = []conformanceCase{
	{"Store/OverlayLevels", testStoreOverlay},
	{"Store/DirtySortedLastWins", testStoreDirty},
	{"Store/ApplyWritesBackendAndClears", testStoreApply},
	{"Store/ScanWhileWriting", testStoreScanWhileWriting},
	{"Store/ScanFromOverlay", testStoreScanFromOverlay},
	{"Store/ScanFromWhileDeleting", testStoreScanFromWhileDeleting},
	{"Store/RecordErrForUnstorableKey", testStoreRecordErr},
	{"Store/MatchesModel", testStoreModel},
	{"Store/ApplyBehindReadsTheEpochUntilWritten", testStoreApplyBehind},
	{"Store/ApplyBehindFailureKeepsTheEpoch", testStoreApplyBehindFailure},
	{"Store/ApplyBehindFailureUnderASealedEpoch", testStoreApplyBehindFailureSealed},
}

// storeOver returns a Store whose backend already holds base.
func storeOver(t *testing.T, kind string, base ...kstate.Mutation) *kstate.Store {
	t.Helper()
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, base...)
	return kstate.NewStore(b)
}

func testStoreOverlay(t *testing.T, kind string) {
	st := storeOver(t, kind, put("a", "b0"), put("b", "b0"), put("c", "b0"), put("e", "b0"))
	// Epoch level: overwrite a, delete b.
	st.Put([]byte("a"), []byte("e1"))
	st.Delete([]byte("b"))
	st.CommitRecord()
	// Record level: overwrite a again, delete c, add d, revive b.
	st.Put([]byte("a"), []byte("r2"))
	st.Delete([]byte("c"))
	st.Put([]byte("d"), []byte("r2"))
	st.Put([]byte("b"), []byte("r2"))

	views := []struct {
		name string
		do   func()
		get  map[string]string // "" means absent
		scan []string
	}{
		{"record over epoch over backend", func() {},
			map[string]string{"a": "r2", "b": "r2", "c": "", "d": "r2", "e": "b0"},
			[]string{"a=r2", "b=r2", "d=r2", "e=b0"}},
		{"after rollback", st.RollbackRecord,
			map[string]string{"a": "e1", "b": "", "c": "b0", "d": "", "e": "b0"},
			[]string{"a=e1", "c=b0", "e=b0"}},
		{"after discard", st.Discard,
			map[string]string{"a": "b0", "b": "b0", "c": "b0", "d": "", "e": "b0"},
			[]string{"a=b0", "b=b0", "c=b0", "e=b0"}},
	}
	for _, v := range views {
		v.do()
		for k, want := range v.get {
			var w []byte
			if want != "" {
				w = []byte(want)
			}
			wantGet(t, st, k, w)
		}
		if got := scanAll(t, st, ""); !slices.Equal(got, v.scan) {
			t.Fatalf("%s: Scan = %q, want %q", v.name, got, v.scan)
		}
	}
	if st.DirtyLen() != 0 {
		t.Fatalf("DirtyLen after Discard = %d", st.DirtyLen())
	}
}

func testStoreDirty(t *testing.T, kind string) {
	st := storeOver(t, kind, put("gone", "x"))
	st.Put([]byte("c"), []byte("1"))
	st.Put([]byte("a"), []byte("1"))
	st.CommitRecord()
	st.Put([]byte("c"), []byte("2"))
	st.Delete([]byte("gone"))
	st.Put([]byte("b"), nil) // nil is stored as empty, never as a delete
	st.CommitRecord()
	st.Put([]byte("a"), []byte("rolled back"))
	st.Put([]byte("z"), []byte("rolled back"))
	st.RollbackRecord()
	st.Delete([]byte("a"))
	st.Put([]byte("c"), []byte("3"))
	st.CommitRecord()

	type mut struct {
		k   string
		v   string
		del bool
	}
	want := []mut{{"a", "", true}, {"b", "", false}, {"c", "3", false}, {"gone", "", true}}
	var got []mut
	for _, m := range st.Dirty() {
		got = append(got, mut{string(m.Key), string(m.Value), m.Value == nil})
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Dirty = %+v, want %+v", got, want)
	}
	if st.DirtyLen() != len(want) {
		t.Fatalf("DirtyLen = %d, want %d", st.DirtyLen(), len(want))
	}
	// Uncommitted record writes are not dirty.
	st.Put([]byte("pending"), []byte("1"))
	if st.DirtyLen() != len(want) {
		t.Fatal("record write-set counted as dirty before CommitRecord")
	}
}

func testStoreApply(t *testing.T, kind string) {
	st := storeOver(t, kind, put("a", "0"), put("b", "0"))
	st.Put([]byte("a"), []byte("1"))
	st.Delete([]byte("b"))
	st.Put([]byte("c"), []byte("1"))
	st.CommitRecord()
	// Backend untouched until Apply: the epoch has not committed.
	wantGet(t, st.Backend(), "a", []byte("0"))
	meta := kstate.Meta{Epoch: 1, ChangelogOffset: 10, Offsets: map[string]int64{"in": 5}}
	if err := st.Apply(st.Dirty(), meta); err != nil {
		t.Fatal(err)
	}
	if st.DirtyLen() != 0 {
		t.Fatalf("DirtyLen after Apply = %d", st.DirtyLen())
	}
	if got := scanAll(t, st.Backend(), ""); !slices.Equal(got, []string{"a=1", "c=1"}) {
		t.Fatalf("backend after Apply = %q", got)
	}
	if m, _ := st.Backend().Meta(); m.Epoch != 1 || m.Offsets["in"] != 5 {
		t.Fatalf("backend meta = %+v", m)
	}
	if s := st.Backend().Stats(); s.Keys != 2 {
		t.Fatalf("Stats.Keys = %d, want 2", s.Keys)
	}
	// A failed Apply keeps the write-set so the caller can retry.
	st.Put([]byte("d"), []byte("1"))
	st.CommitRecord()
	_ = st.Backend().Close()
	if err := st.Apply(st.Dirty(), kstate.Meta{Epoch: 2}); !errors.Is(err, kstate.ErrClosed) {
		t.Fatalf("Apply on closed backend = %v", err)
	}
	if st.DirtyLen() != 1 {
		t.Fatalf("DirtyLen after failed Apply = %d, want 1", st.DirtyLen())
	}
}

func testStoreScanWhileWriting(t *testing.T, kind string) {
	st := storeOver(t, kind, put("p/a", "b"), put("p/c", "b"))
	st.Put([]byte("p/b"), []byte("e"))
	st.CommitRecord()
	st.Put([]byte("p/d"), []byte("r"))
	var seen []string
	err := st.Scan([]byte("p/"), func(k, v []byte) error {
		seen = append(seen, string(k))
		st.Delete(k) // writes during a scan do not disturb it
		st.Put([]byte("p/bb"), []byte("new"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"p/a", "p/b", "p/c", "p/d"}; !slices.Equal(seen, want) {
		t.Fatalf("scan saw %q, want %q", seen, want)
	}
	if got := scanAll(t, st, "p/"); !slices.Equal(got, []string{"p/bb=new"}) {
		t.Fatalf("after scan: %q", got)
	}
	// ErrStopScan works wherever the merge stands: on a backend entry, an
	// epoch entry or a record entry.
	st = storeOver(t, kind, put("a", "b"), put("d", "b"))
	st.Put([]byte("b"), []byte("e"))
	st.CommitRecord()
	st.Put([]byte("c"), []byte("r"))
	st.Put([]byte("e"), []byte("r"))
	for stopAt := 1; stopAt <= 5; stopAt++ {
		n := 0
		err := st.Scan(nil, func(k, v []byte) error {
			if n++; n == stopAt {
				return kstate.ErrStopScan
			}
			return nil
		})
		if err != nil || n != stopAt {
			t.Fatalf("stop at %d: err %v after %d", stopAt, err, n)
		}
	}
}

// testStoreScanFromOverlay starts a scan at every kind of position in a
// merge of three levels: on an entry of each level, on a tombstone of each
// write-set (hiding a backend entry or not), between entries, and past the
// range.
func testStoreScanFromOverlay(t *testing.T, kind string) {
	st := storeOver(t, kind, put("p/a", "b"), put("p/c", "b"), put("p/e", "b"), put("p/g", "b"), put("q/a", "b"))
	st.Put([]byte("p/b"), []byte("e"))
	st.Delete([]byte("p/c")) // hides a backend entry
	st.Put([]byte("p/f"), []byte("e"))
	st.Delete([]byte("p/h")) // hides nothing
	st.Put([]byte("q/0"), []byte("e"))
	st.CommitRecord()
	st.Put([]byte("p/0"), []byte("r"))
	st.Put([]byte("p/d"), []byte("r"))
	st.Delete([]byte("p/e")) // hides a backend entry
	st.Put([]byte("p/g"), []byte("r"))
	st.Delete([]byte("p/f")) // hides an epoch entry

	view := []string{"p/0=r", "p/a=b", "p/b=e", "p/d=r", "p/g=r"}
	if got := scanAll(t, st, "p/"); !slices.Equal(got, view) {
		t.Fatalf("Scan = %q, want %q", got, view)
	}
	tests := []struct {
		name, start string
	}{
		{"nil start", ""},
		{"before the prefix", "a"},
		{"at the prefix", "p/"},
		{"on a record entry", "p/0"},
		{"on a backend entry", "p/a"},
		{"between entries", "p/aa"},
		{"on an epoch entry", "p/b"},
		{"on an epoch tombstone over the backend", "p/c"},
		{"on a record entry after a tombstone", "p/d"},
		{"on a record tombstone over the backend", "p/e"},
		{"on a record tombstone over the epoch", "p/f"},
		{"on a record entry over the backend", "p/g"},
		{"on a tombstone hiding nothing", "p/h"},
		{"past the range", "p/z"},
		{"in the next range", "q/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := fromStart(view, tt.start)
			if got := scanFromAll(t, st, "p/", tt.start); !slices.Equal(got, want) {
				t.Fatalf("ScanFrom(p/, %q) = %q, want %q", tt.start, got, want)
			}
		})
	}
}

// testStoreScanFromWhileDeleting is what SweepExpired relies on: deleting
// each key as it is visited, including keys ahead of the scan, does not
// disturb a ScanFrom, and ErrStopScan works on each level.
func testStoreScanFromWhileDeleting(t *testing.T, kind string) {
	st := storeOver(t, kind, put("p/a", "b"), put("p/c", "b"), put("p/e", "b"))
	st.Put([]byte("p/b"), []byte("e"))
	st.Put([]byte("p/d"), []byte("e"))
	st.CommitRecord()
	var seen []string
	err := st.ScanFrom([]byte("p/"), []byte("p/b"), func(k, v []byte) error {
		seen = append(seen, string(k))
		st.Delete(k)
		st.Delete([]byte("p/e")) // ahead of the scan
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"p/b", "p/c", "p/d", "p/e"}; !slices.Equal(seen, want) {
		t.Fatalf("ScanFrom saw %q, want %q", seen, want)
	}
	if got := scanAll(t, st, "p/"); !slices.Equal(got, []string{"p/a=b"}) {
		t.Fatalf("after ScanFrom: %q", got)
	}
	st.RollbackRecord()
	st.Put([]byte("p/f"), []byte("r"))
	for stopAt := 1; stopAt <= 4; stopAt++ { // p/c backend, p/d epoch, p/e backend, p/f record
		n := 0
		err := st.ScanFrom([]byte("p/"), []byte("p/c"), func(k, v []byte) error {
			if n++; n == stopAt {
				return kstate.ErrStopScan
			}
			return nil
		})
		if err != nil || n != stopAt {
			t.Fatalf("stop at %d: err %v after %d", stopAt, err, n)
		}
	}
}

func testStoreRecordErr(t *testing.T, kind string) {
	tests := []struct {
		name  string
		write func(st *kstate.Store)
	}{
		{"empty key put", func(st *kstate.Store) { st.Put(nil, []byte("v")) }},
		{"empty key delete", func(st *kstate.Store) { st.Delete([]byte{}) }},
		{"oversize put", func(st *kstate.Store) { st.Put(bytes.Repeat([]byte("k"), kstate.MaxKeySize+1), nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := storeOver(t, kind)
			st.Put([]byte("ok"), []byte("1"))
			tt.write(st)
			st.Put([]byte("ok2"), []byte("1"))
			if err := st.RecordErr(); !errors.Is(err, kstate.ErrBadKey) {
				t.Fatalf("RecordErr = %v, want ErrBadKey", err)
			}
			st.RollbackRecord()
			if err := st.RecordErr(); err != nil {
				t.Fatalf("RecordErr after rollback = %v", err)
			}
			if st.DirtyLen() != 0 {
				t.Fatal("rolled back record left dirty keys")
			}
		})
	}
}

// testStoreModel drives a Store with random operations and checks every
// read against a plain-map model of its levels (backend, a failed write
// behind, the write behind, sealed epoch, epoch, record). Keys share
// prefixes so scans cross level boundaries; the seeds are fixed so
// failures repeat. Values are often as long as the one before them (so
// writes go over them in place, Store.overwrite) and at times empty;
// some go through a typed state, some through a scan's callback; Dirty is
// taken with a record in flight too, and every mutation it ever returned
// must stay as it was (the changelog's records hold them). Written over
// in place, an empty value once came out of Dirty as a delete (found by
// a review's model test, merged into this one).
func testStoreModel(t *testing.T, kind string) {
	// bbolt's applies are commits to a file: fewer runs keep it quick.
	runs := 1000
	if kind != "memory" {
		runs = 40
	}
	for seed := range uint64(runs) {
		storeModelRun(t, kind, seed)
	}
}

func storeModelRun(t *testing.T, kind string, seed uint64) {
	typed := kstate.Value("v", kstate.Bytes())
	userKeys := []string{"x", "y"}
	keys := []string{"a", "aa", "ab", "aba", "b", "ba", "bb", "c", "\x00", "\xff"}
	for _, u := range userKeys {
		keys = append(keys, string(kstate.EncodeKey(kstate.KindKeyed, "v", []byte(u), nil)))
	}
	prefixes := []string{"", "a", "ab", "b", "c", "d", "\x00", "\xff"}
	type level map[string]*string // nil value: tombstone
	var (
		backend = map[string]string{}
		failed  level // a write behind that failed, once settled: it stays
		behind  level // the epoch written behind, until settled
		sealed  level // nil: no epoch is sealed
		epoch   = level{}
		record  = level{}
		// sealedDirty is the sealed epoch's Dirty, taken at its seal as
		// the engine's preCommit takes it.
		sealedDirty []kstate.Mutation
		// held is every Dirty returned, with a copy of what it held.
		held     []struct{ muts, was []kstate.Mutation }
		inFlight bool
	)
	model := func() map[string]string {
		out := maps.Clone(backend)
		for _, l := range []level{failed, behind, sealed, epoch, record} {
			for k, v := range l {
				if v == nil {
					delete(out, k)
				} else {
					out[k] = *v
				}
			}
		}
		return out
	}
	dirtyOf := func(l level) []kstate.Mutation {
		var out []kstate.Mutation
		for _, k := range slices.Sorted(maps.Keys(l)) {
			m := kstate.Mutation{Key: []byte(k)}
			if v := l[k]; v != nil {
				m.Value = []byte(*v)
			}
			out = append(out, m)
		}
		return out
	}
	be := newGated(t, kind)
	close(be.gate)
	st := kstate.NewStore(be)
	sc := kstatetest.NewScope(st)
	rng := rand.New(rand.NewPCG(seed, uint64(len(kind))))
	last := map[string]string{}
	value := func(k string) string {
		switch r := rng.IntN(10); {
		case r == 0:
			return ""
		case r < 6 && last[k] != "": // as long as the key's last: in place
			return strings.Repeat(string(rune('a'+rng.IntN(26))), len(last[k]))
		}
		return fmt.Sprint(rng.IntN(100000))
	}
	takeDirty := func(step int, op string) []kstate.Mutation {
		d := st.Dirty()
		if want := dirtyOf(epoch); !mutationsEqual(d, want) {
			t.Fatalf("seed %d step %d (%s): Dirty = %s, want %s", seed, step, op, showMutations(d), showMutations(want))
		}
		was := make([]kstate.Mutation, len(d))
		for i, m := range d {
			was[i] = kstate.Mutation{Key: bytes.Clone(m.Key), Value: bytes.Clone(m.Value)}
		}
		// Its own slice of the mutations (a backend's Apply may write the
		// slice behind), over the Store's bytes.
		held = append(held, struct{ muts, was []kstate.Mutation }{slices.Clone(d), was})
		return d
	}
	// intoBackend is an epoch written to the backend.
	intoBackend := func(l level) {
		for k, v := range l {
			if v == nil {
				delete(backend, k)
			} else {
				backend[k] = *v
			}
		}
	}
	// settled mirrors a write behind once the Store has settled it:
	// written, it is in the backend; failed, it stays as a level of its
	// own, and the epoch takes its keys that neither it nor the sealed
	// epoch changed (Store.fold).
	settled := func() {
		if behind == nil || st.Behind() {
			return
		}
		if be.fail == nil {
			intoBackend(behind)
		} else {
			failed = behind
			for k, v := range failed {
				if _, ok := epoch[k]; !ok && (sealed == nil || !hasKey(sealed, k)) {
					epoch[k] = v
				}
			}
		}
		behind = nil
	}
	var epochNo uint64
	for step := range 300 {
		k := keys[rng.IntN(len(keys))]
		var op string
		switch r := rng.IntN(100); {
		case r < 30:
			op = "put"
			v := value(k)
			st.Put([]byte(k), []byte(v))
			record[k], last[k], inFlight = &v, v, true
		case r < 38:
			op = "typed set"
			u := rng.IntN(len(userKeys))
			k = keys[len(keys)-len(userKeys)+u]
			v := value(k)
			if err := typed.Set(sc.SetKey(userKeys[u]), []byte(v)); err != nil {
				t.Fatal(err)
			}
			record[k], last[k], inFlight = &v, v, true
		case r < 48:
			op = "delete"
			st.Delete([]byte(k))
			record[k], inFlight = nil, true
		case r < 51:
			op = "scan writing"
			err := st.Scan(nil, func(k, _ []byte) error {
				if rng.IntN(2) == 0 {
					v := value(string(k))
					st.Put(k, []byte(v))
					record[string(k)], last[string(k)] = &v, v
				}
				return nil
			})
			if err != nil && failed == nil {
				t.Fatal(err)
			}
			inFlight = true
		case r < 64:
			op = "commit"
			st.CommitRecord()
			maps.Copy(epoch, record)
			clear(record)
			inFlight = false
		case r < 71:
			op = "rollback"
			st.RollbackRecord()
			clear(record)
			inFlight = false
		case r < 75:
			op = "dirty"
			if inFlight {
				op = "dirty in flight"
			}
			takeDirty(step, op)
		case r < 81:
			op = "seal"
			st.CommitRecord()
			maps.Copy(epoch, record)
			clear(record)
			inFlight = false
			dirty := takeDirty(step, op)
			err := st.Seal()
			if sealed != nil {
				if err == nil {
					t.Fatalf("seed %d step %d: Seal with an epoch sealed already succeeded", seed, step)
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			sealed, sealedDirty, epoch = epoch, dirty, level{}
		case r < 93:
			op = "apply"
			st.CommitRecord()
			maps.Copy(epoch, record)
			clear(record)
			inFlight = false
			dirty, applied := takeDirty(step, op), epoch
			if sealed != nil {
				// The sealed epoch committed: it is the one applied,
				// and the current one goes on.
				op = "apply sealed"
				dirty, applied = sealedDirty, sealed
			}
			epochNo++
			if behind != nil {
				// What Apply and ApplyBehind do first.
				st.Settle()
				settled()
			}
			if rng.IntN(2) == 0 {
				if err := st.Apply(dirty, kstate.Meta{Epoch: epochNo}); err != nil {
					if failed == nil {
						t.Fatal(err)
					}
					break // a failed write behind fails every apply after it
				}
				intoBackend(applied)
			} else {
				// The write runs on a goroutine of its own, so the
				// reads below may meet it (the race detector watches);
				// a scan, an apply or the next write behind settles
				// it. One in four fails, when none is under way.
				op += " behind"
				if !st.Behind() && failed == nil && rng.IntN(4) == 0 {
					op += ", failing"
					be.fail = errors.New("injected")
				}
				if err := st.ApplyBehind(dirty, kstate.Meta{Epoch: epochNo}, goWrite); err != nil {
					if failed == nil {
						t.Fatal(err)
					}
					break
				}
				behind = applied
			}
			if sealed != nil {
				sealed, sealedDirty = nil, nil
			} else {
				epoch = level{}
			}
		default:
			op = "discard"
			st.Discard()
			sealed, sealedDirty, inFlight = nil, nil, false
			epoch = level{}
			clear(record)
			for k, v := range failed {
				epoch[k] = v
			}
		}
		settled()
		if st.Sealed() != (sealed != nil) {
			t.Fatalf("seed %d step %d (%s): Sealed = %v, want %v", seed, step, op, st.Sealed(), sealed != nil)
		}
		want := model()
		for _, k := range keys {
			got, ok, err := st.Get([]byte(k))
			w, wok := want[k]
			if err != nil || ok != wok || string(got) != w {
				t.Fatalf("seed %d step %d (%s): Get(%q) = %q,%v,%v; want %q,%v", seed, step, op, k, got, ok, err, w, wok)
			}
		}
		if !inFlight {
			bytes := 0
			for k, v := range epoch {
				bytes += len(k)
				if v != nil {
					bytes += len(*v)
				}
			}
			if st.DirtyLen() != len(epoch) || st.DirtyBytes() != bytes {
				t.Fatalf("seed %d step %d (%s): DirtyLen, DirtyBytes = %d, %d; want %d, %d", seed, step, op, st.DirtyLen(), st.DirtyBytes(), len(epoch), bytes)
			}
		}
		for _, h := range held {
			if !mutationsEqual(h.muts, h.was) {
				t.Fatalf("seed %d step %d (%s): a Dirty taken before changed: %s, was %s", seed, step, op, showMutations(h.muts), showMutations(h.was))
			}
		}
		// A scan settles a write behind, so most steps do without one:
		// the writes stay behind across steps, under the puts,
		// rollbacks, discards and the next apply.
		if rng.IntN(3) != 0 {
			continue
		}
		p := prefixes[rng.IntN(len(prefixes))]
		var wantScan []string
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if strings.HasPrefix(k, p) {
				wantScan = append(wantScan, k+"="+want[k])
			}
		}
		if got := scanAll(t, st, p); !slices.Equal(got, wantScan) {
			t.Fatalf("seed %d step %d (%s): Scan(%q) = %q, want %q", seed, step, op, p, got, wantScan)
		}
		start := keys[rng.IntN(len(keys))]
		if got, want := scanFromAll(t, st, p, start), fromStart(wantScan, start); !slices.Equal(got, want) {
			t.Fatalf("seed %d step %d (%s): ScanFrom(%q, %q) = %q, want %q", seed, step, op, p, start, got, want)
		}
		settled()
	}
	err := st.Settle()
	settled()
	if err == nil {
		if s := be.Stats(); s.Keys != int64(len(backend)) {
			t.Fatalf("seed %d: Stats.Keys = %d, want %d", seed, s.Keys, len(backend))
		}
	}
}

func hasKey[M ~map[string]V, V any](m M, k string) bool { _, ok := m[k]; return ok }

// mutationsEqual is slices.Equal for mutations, a delete (nil value)
// unequal to an empty value.
func mutationsEqual(a, b []kstate.Mutation) bool {
	return slices.EqualFunc(a, b, func(x, y kstate.Mutation) bool {
		return bytes.Equal(x.Key, y.Key) && (x.Value == nil) == (y.Value == nil) && bytes.Equal(x.Value, y.Value)
	})
}

// showMutations formats mutations for a failure: a delete as <delete>, a
// long value by its length and first bytes.
func showMutations(ms []kstate.Mutation) string {
	var b strings.Builder
	for _, m := range ms {
		switch v := m.Value; {
		case v == nil:
			fmt.Fprintf(&b, "[%q <delete>]", m.Key)
		case len(v) > 16:
			fmt.Fprintf(&b, "[%q %d bytes %q…]", m.Key, len(v), v[:8])
		default:
			fmt.Fprintf(&b, "[%q %q]", m.Key, v)
		}
	}
	return b.String()
}

// gatedBackend holds every Apply until gate is closed, then fails it with
// fail (if set); scanned is closed by the first scan that begins while an
// Apply is held.
type gatedBackend struct {
	kstate.Backend
	gate     chan struct{}
	fail     error
	applying atomic.Bool
	once     sync.Once
	scanned  chan struct{}
}

func newGated(t *testing.T, kind string, base ...kstate.Mutation) *gatedBackend {
	b := mustOpen(t, kind)
	mustApply(t, b, kstate.Meta{}, base...)
	return &gatedBackend{Backend: b, gate: make(chan struct{}), scanned: make(chan struct{})}
}

// start is ApplyBehind's start: the write counts as under way from here,
// before its goroutine runs.
func (b *gatedBackend) start(w func()) {
	b.applying.Store(true)
	go w()
}

func (b *gatedBackend) Apply(muts []kstate.Mutation, meta kstate.Meta) error {
	defer b.applying.Store(false)
	<-b.gate
	if b.fail != nil {
		return b.fail
	}
	return b.Backend.Apply(muts, meta)
}

func (b *gatedBackend) Scan(prefix []byte, fn func(k, v []byte) error) error {
	return b.ScanFrom(prefix, prefix, fn)
}

func (b *gatedBackend) ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error {
	if b.applying.Load() {
		b.once.Do(func() { close(b.scanned) })
	}
	return b.Backend.ScanFrom(prefix, start, fn)
}

// goWrite is ApplyBehind's start as the engine's: a goroutine of its own.
func goWrite(w func()) { go w() }

// While an epoch's write is held, the Store reads that epoch (puts,
// deletes) under the next one's write-set, which starts empty and goes to
// Dirty alone; a scan waits for the write rather than scan the backend
// beside it; once written, the backend has the epoch and the Store reads
// it there.
func testStoreApplyBehind(t *testing.T, kind string) {
	b := newGated(t, kind, put("a", "b0"), put("b", "b0"), put("c", "b0"))
	st := kstate.NewStore(b)
	st.Put([]byte("a"), []byte("e1"))
	st.Delete([]byte("b"))
	st.Put([]byte("d"), []byte("e1"))
	st.CommitRecord()
	if err := st.ApplyBehind(st.Dirty(), kstate.Meta{Epoch: 1}, b.start); err != nil {
		t.Fatal(err)
	}
	if !st.Behind() || st.DirtyLen() != 0 {
		t.Fatalf("Behind %v, DirtyLen %d after ApplyBehind; want true, 0", st.Behind(), st.DirtyLen())
	}
	wantGet(t, st, "a", []byte("e1"))
	wantGet(t, st, "b", nil)
	wantGet(t, st, "c", []byte("b0"))
	wantGet(t, st, "d", []byte("e1"))
	st.Put([]byte("a"), []byte("e2"))
	st.CommitRecord()
	st.Put([]byte("d"), []byte("x")) // a record that fails
	st.Put([]byte("e"), []byte("x"))
	st.RollbackRecord()
	wantGet(t, st, "d", []byte("e1"))
	wantGet(t, st, "e", nil)
	if got := fmt.Sprint(st.Dirty()); got != fmt.Sprint([]kstate.Mutation{put("a", "e2")}) {
		t.Fatalf("Dirty = %s, want the second epoch's a=e2 alone", got)
	}
	done := make(chan []string)
	go func() {
		var out []string
		_ = st.Scan(nil, func(k, v []byte) error {
			out = append(out, string(k)+"="+string(v))
			return nil
		})
		done <- out
	}()
	// A scan of the backend beside its write shows up here; none may.
	select {
	case <-b.scanned:
		t.Fatal("the Store scanned its backend while the epoch's write was held")
	case <-time.After(50 * time.Millisecond):
	}
	close(b.gate)
	if got := <-done; !slices.Equal(got, []string{"a=e2", "c=b0", "d=e1"}) {
		t.Fatalf("Scan = %q, want [a=e2 c=b0 d=e1]", got)
	}
	if st.Behind() {
		t.Fatal("the scan did not settle the write")
	}
	wantGet(t, b.Backend, "a", []byte("e1"))
	wantGet(t, b.Backend, "b", nil)
	if m, err := b.Meta(); err != nil || m.Epoch != 1 {
		t.Fatalf("backend meta %+v %v, want epoch 1", m, err)
	}
	wantGet(t, st, "d", []byte("e1"))
}

// A write behind that fails leaves the backend at the epoch before; the
// Store keeps reading the epoch (a record in flight that rolls back a key
// the epoch changed falls back to the epoch's value, not the backend's;
// so does an abort of the next epoch), the next epoch's Dirty carries the
// epoch's keys so a later Apply would write them, and every Settle, Apply
// and ApplyBehind reports the error.
func testStoreApplyBehindFailure(t *testing.T, kind string) {
	b := newGated(t, kind, put("a", "b0"))
	b.fail = errors.New("disk on fire")
	st := kstate.NewStore(b)
	st.Put([]byte("a"), []byte("e1"))
	st.Put([]byte("g"), []byte("e1"))
	st.CommitRecord()
	if err := st.ApplyBehind(st.Dirty(), kstate.Meta{Epoch: 1}, goWrite); err != nil {
		t.Fatal(err)
	}
	st.Put([]byte("h"), []byte("e2"))
	st.CommitRecord()
	st.Put([]byte("g"), []byte("z")) // in flight across the failure
	close(b.gate)
	if err := st.Settle(); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Settle = %v, want the write's error", err)
	}
	wantGet(t, st, "g", []byte("z"))
	st.RollbackRecord()
	wantGet(t, st, "g", []byte("e1"))
	wantGet(t, st, "a", []byte("e1"))
	wantGet(t, b.Backend, "a", []byte("b0"))
	if got := scanAll(t, st, ""); !slices.Equal(got, []string{"a=e1", "g=e1", "h=e2"}) {
		t.Fatalf("Scan = %q, want [a=e1 g=e1 h=e2]", got)
	}
	if got := fmt.Sprint(st.Dirty()); got != fmt.Sprint([]kstate.Mutation{put("a", "e1"), put("g", "e1"), put("h", "e2")}) {
		t.Fatalf("Dirty = %s, want the failed epoch's keys with the next one's", got)
	}
	// The next epoch aborts: its own change goes, the failed epoch's stay.
	st.Discard()
	wantGet(t, st, "a", []byte("e1"))
	wantGet(t, st, "g", []byte("e1"))
	wantGet(t, st, "h", nil)
	if got := fmt.Sprint(st.Dirty()); got != fmt.Sprint([]kstate.Mutation{put("a", "e1"), put("g", "e1")}) {
		t.Fatalf("Dirty after Discard = %s, want the failed epoch's keys", got)
	}
	if err := st.Rewrite([]byte("g")); err != nil {
		t.Fatal(err)
	}
	wantGet(t, st, "g", []byte("e1"))
	if err := st.Settle(); err == nil {
		t.Fatal("a second Settle forgot the error")
	}
	if err := st.Apply(st.Dirty(), kstate.Meta{Epoch: 2}); err == nil {
		t.Fatal("Apply after a failed write behind succeeded")
	}
	if err := st.ApplyBehind(st.Dirty(), kstate.Meta{Epoch: 2}, goWrite); err == nil {
		t.Fatal("ApplyBehind after a failed write behind succeeded")
	}
}

// A write behind that fails while the next epoch is sealed (pipelined
// epochs) folds the failed epoch under the sealed one, not over it: a key
// both changed reads the sealed epoch's value; and when the sealed epoch is
// discarded (it aborted), the failed epoch's value is what remains.
func testStoreApplyBehindFailureSealed(t *testing.T, kind string) {
	b := newGated(t, kind, put("a", "b0"), put("s", "b0"))
	b.fail = errors.New("disk on fire")
	st := kstate.NewStore(b)
	st.Put([]byte("a"), []byte("e1"))
	st.Put([]byte("s"), []byte("e1"))
	st.CommitRecord()
	if err := st.ApplyBehind(st.Dirty(), kstate.Meta{Epoch: 1}, goWrite); err != nil {
		t.Fatal(err)
	}
	st.Put([]byte("s"), []byte("e2"))
	st.CommitRecord()
	if err := st.Seal(); err != nil {
		t.Fatal(err)
	}
	// A record of the epoch after the sealed one creates s's node in its
	// write-set and is in flight across the failure.
	st.Put([]byte("s"), []byte("z"))
	close(b.gate)
	if err := st.Settle(); err == nil {
		t.Fatal("Settle forgot the write's error")
	}
	st.RollbackRecord()
	wantGet(t, st, "s", []byte("e2"))
	wantGet(t, st, "a", []byte("e1"))
	if got := scanAll(t, st, ""); !slices.Equal(got, []string{"a=e1", "s=e2"}) {
		t.Fatalf("Scan = %q, want [a=e1 s=e2]", got)
	}
	st.Discard()
	wantGet(t, st, "s", []byte("e1"))
	wantGet(t, st, "a", []byte("e1"))
	if st.Sealed() {
		t.Fatal("Discard kept the sealed epoch")
	}
}
