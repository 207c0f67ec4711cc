package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"testing"
	"time"
)

// The Store against a model of what it must hold, over random runs of
// writes (raw, typed, in scans, deletes, values of 0 to 1,500 bytes),
// commits, rollbacks, Dirty with a record in flight or not, Apply, Seal,
// ApplyBehind that fails or not and settles late, and Discard. After
// every step: every key's Get against the model, DirtyBytes and DirtyLen,
// and every mutation Dirty ever gave unchanged byte for byte (the
// changelog's records hold them). Written by a review of the in-place
// writes (Store.overwrite); it found that an empty value written in place
// came out of Dirty as a delete.

// modelScope is a Scope over a Store, for the typed writes.
type modelScope struct {
	st  *Store
	key []byte
}

func (s modelScope) Store() *Store  { return s.st }
func (s modelScope) Key() []byte    { return s.key }
func (s modelScope) Now() time.Time { return time.Unix(1000, 0) }

type failingBackend struct {
	Backend
	fail bool
}

func (f *failingBackend) Apply(m []Mutation, meta Meta) error {
	if f.fail {
		return errors.New("injected")
	}
	return f.Backend.Apply(m, meta)
}

type heldMuts struct {
	muts []Mutation
	snap []Mutation
	at   int
}

// showMuts formats mutations for a failure: a delete as <delete>, an
// empty value as "", a long one by its length and first bytes.
func showMuts(ms []Mutation) string {
	var b bytes.Buffer
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

func cloneMuts(m []Mutation) []Mutation {
	out := make([]Mutation, len(m))
	for i, x := range m {
		out[i] = Mutation{Key: bytes.Clone(x.Key), Value: bytes.Clone(x.Value)}
	}
	return out
}

// model: maps of key -> value; a value of nil pointer means delete.
type change map[string]*string

func TestStoreAgainstAModel(t *testing.T) {
	inPlace := 0
	for seed := int64(0); seed < 1000; seed++ {
		inPlace += modelRun(t, seed)
	}
	// The runs must have written over values in place, or they test
	// nothing of it.
	if inPlace < 500 {
		t.Fatalf("%d writes in place over 1,000 runs", inPlace)
	}
}

// modelRun is one random run of 300 steps; it returns how many writes
// went in place.
func modelRun(t *testing.T, seed int64) (inPlaceCount int) {
	rng := rand.New(rand.NewSource(seed))
	fb := &failingBackend{Backend: NewMemory()}
	st := NewStore(fb)
	backend := map[string]string{}
	var sealed change // nil: none
	var failed change
	epoch := change{}
	record := change{}
	keys := []string{"a", "b", "c", "d"}
	vs := Value("v", Bytes())
	ukeys := []string{"x", "y"}
	for _, u := range ukeys {
		keys = append(keys, string(EncodeKey(KindKeyed, "v", []byte(u), nil)))
	}
	var behindC change
	pendingFail, pending := false, false
	resolve := func() {
		if !pending || st.Behind() {
			return
		}
		pending = false
		if pendingFail {
			failed = behindC
			for k, v := range failed {
				if _, ok := epoch[k]; ok {
					continue
				}
				if sealed != nil {
					if _, ok := sealed[k]; ok {
						continue
					}
				}
				epoch[k] = v
			}
		} else {
			for k, v := range behindC {
				if v == nil {
					delete(backend, k)
				} else {
					backend[k] = *v
				}
			}
		}
		behindC = nil
	}
	lens := []int{0, 1, 3, 8, 1500}
	var hold []heldMuts
	step := 0
	val := func() []byte {
		n := lens[rng.Intn(len(lens))]
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('A' + rng.Intn(26))
		}
		return b
	}
	view := func(k string) (string, bool) {
		for _, c := range []change{record, epoch, sealed, behindC, failed} {
			if c == nil {
				continue
			}
			if v, ok := c[k]; ok {
				if v == nil {
					return "", false
				}
				return *v, true
			}
		}
		v, ok := backend[k]
		return v, ok
	}
	fail := func(f string, a ...any) {
		t.Helper()
		t.Fatalf("seed %d step %d: %s", seed, step, fmt.Sprintf(f, a...))
	}
	wantDirty := func() []Mutation {
		var ks []string
		for k := range epoch {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		var out []Mutation
		for _, k := range ks {
			var v []byte
			if p := epoch[k]; p != nil {
				v = []byte(*p)
			}
			out = append(out, Mutation{Key: []byte(k), Value: v})
		}
		return out
	}
	same := func(a, b []Mutation) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if !bytes.Equal(a[i].Key, b[i].Key) || (a[i].Value == nil) != (b[i].Value == nil) || !bytes.Equal(a[i].Value, b[i].Value) {
				return false
			}
		}
		return true
	}
	commitRec := func() {
		for k, v := range record {
			epoch[k] = v
		}
		record = change{}
	}
	put := func(k string, v []byte) {
		s := string(v)
		record[k] = &s
		st.Put([]byte(k), v)
		if len(st.undo) > 0 && st.undo[len(st.undo)-1].inPlace {
			inPlaceCount++
		}
	}
	var sealedDirty []Mutation
	for step = 0; step < 300; step++ {
		inFlight := len(record) > 0
		switch r := rng.Intn(100); {
		case r < 25:
			put(keys[rng.Intn(len(keys))], val())
		case r < 35:
			u := rng.Intn(len(ukeys))
			v := val()
			sv := string(v)
			record[keys[4+u]] = &sv
			if err := vs.Set(modelScope{st: st, key: []byte(ukeys[u])}, v); err != nil {
				fail("Set: %v", err)
			}
			if len(st.undo) > 0 && st.undo[len(st.undo)-1].inPlace {
				inPlaceCount++
			}
		case r < 40:
			k := keys[rng.Intn(len(keys))]
			record[k] = nil
			st.Delete([]byte(k))
		case r < 43: // a scan whose callback writes
			_ = st.Scan(nil, func(k, v []byte) error {
				if rng.Intn(2) == 0 {
					put(string(k), val())
				}
				return nil
			})
		case r < 60:
			commitRec()
			st.CommitRecord()
		case r < 68:
			record = change{}
			st.RollbackRecord()
		case r < 74: // Dirty, with a record in flight or not
			d := st.Dirty()
			if !same(d, wantDirty()) {
				fail("Dirty (in flight %v) = %s, want %s", inFlight, showMuts(d), showMuts(wantDirty()))
			}
			hold = append(hold, heldMuts{append([]Mutation(nil), d...), cloneMuts(d), step})
		case r < 82: // end of epoch, between records
			if inFlight {
				continue
			}
			d := st.Dirty()
			if !same(d, wantDirty()) {
				fail("Dirty = %s, want %s", showMuts(d), showMuts(wantDirty()))
			}
			hold = append(hold, heldMuts{append([]Mutation(nil), d...), cloneMuts(d), step})
			switch rng.Intn(4) {
			case 0: // apply now
				if st.Sealed() {
					continue
				}
				wasPending := pending
				err := st.Apply(d, Meta{Epoch: uint64(step)})
				if wasPending {
					resolve()
				}
				if err != nil {
					if failed == nil {
						fail("Apply: %v", err)
					}
					continue
				}
				for _, m := range d {
					if m.Value == nil {
						delete(backend, string(m.Key))
					} else {
						backend[string(m.Key)] = string(m.Value)
					}
				}
				epoch = change{}
			case 1: // seal
				if st.Sealed() {
					continue
				}
				if err := st.Seal(); err != nil {
					fail("Seal: %v", err)
				}
				sealed, sealedDirty, epoch = epoch, d, change{}
			case 2: // apply the sealed one behind (maybe failing), settled later
				if !st.Sealed() || failed != nil || pending {
					continue
				}
				fb.fail = rng.Intn(3) == 0
				pendingFail = fb.fail
				gate := make(chan struct{})
				err := st.ApplyBehind(sealedDirty, Meta{Epoch: uint64(step)}, func(w func()) { go func() { <-gate; w() }() })
				if err != nil {
					fail("ApplyBehind: %v", err)
				}
				behindC, pending = sealed, true
				sealed, sealedDirty = nil, nil
				close(gate)
			case 3: // abort
				if pending {
					_ = st.Settle()
					resolve()
				}
				st.Discard()
				record, epoch, sealed, sealedDirty = change{}, change{}, nil, nil
				for k, v := range failed {
					epoch[k] = v
				}
			}
		}
		resolve()
		for _, k := range keys {
			got, ok, err := st.Get([]byte(k))
			want, wok := view(k)
			if err != nil || ok != wok || string(got) != want {
				fail("Get(%s) = %q,%v, want %q,%v", k, got, ok, want, wok)
			}
		}
		for _, h := range hold {
			if !same(h.muts, h.snap) {
				fail("mutations Dirty gave at step %d changed: %s, were %s", h.at, showMuts(h.muts), showMuts(h.snap))
			}
		}
		if len(record) == 0 && len(st.undo) == 0 {
			var b int
			for k, v := range epoch {
				b += len(k)
				if v != nil {
					b += len(*v)
				}
			}
			if st.DirtyBytes() != b || st.DirtyLen() != len(epoch) {
				fail("DirtyBytes %d DirtyLen %d, want %d %d", st.DirtyBytes(), st.DirtyLen(), b, len(epoch))
			}
		}
	}
	return inPlaceCount
}
