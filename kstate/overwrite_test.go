package kstate

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// A write of a value as long as the key's epoch value goes over it in
// place: a hot key costs the epoch no new memory however often it is
// written, and everything that reads the write-set sees what it would
// have seen had each write taken new bytes.
func TestOverwriteInPlace(t *testing.T) {
	k, k2 := []byte("k"), []byte("k2")
	v := func(c byte) []byte { return bytes.Repeat([]byte{c}, 32) }
	get := func(t *testing.T, st *Store) string {
		t.Helper()
		b, ok, err := st.Get(k)
		if err != nil || !ok {
			t.Fatalf("Get: %v, %v", ok, err)
		}
		return string(b)
	}

	t.Run("a hot key takes no new memory", func(t *testing.T) {
		st := NewStore(NewMemory())
		st.Put(k, v('a'))
		st.CommitRecord()
		held := st.EpochMemory()
		for i := range 100_000 {
			st.Put(k, v(byte(i)))
			st.CommitRecord()
		}
		if got := st.EpochMemory(); got != held {
			t.Fatalf("EpochMemory went from %d to %d over 100,000 writes of one key", held, got)
		}
		if got := get(t, st); got != string(v(byte(99_999%256))) {
			t.Fatalf("Get = %x, want the last write", got)
		}
	})

	t.Run("rollback", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			writes [][]byte // the rolled-back record's writes of k
		}{
			{"one write", [][]byte{v('b')}},
			{"two writes", [][]byte{v('b'), v('c')}},
			{"then another length", [][]byte{v('b'), []byte("short")}},
			{"then a delete", [][]byte{v('b'), nil}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				st := NewStore(NewMemory())
				st.Put(k, v('a'))
				st.Put(k2, v('x'))
				st.CommitRecord()
				before := st.DirtyBytes()
				for _, w := range tc.writes {
					if w == nil {
						st.Delete(k)
					} else {
						st.Put(k, w)
					}
				}
				st.RollbackRecord()
				if got := get(t, st); got != string(v('a')) {
					t.Fatalf("after the rollback Get = %q, want the committed record's value", got)
				}
				if got := st.DirtyBytes(); got != before {
					t.Fatalf("DirtyBytes = %d after the rollback, want %d", got, before)
				}
				// A record that overwrites another key in place, and
				// rolls back, reuses the undo buffer: k's value must
				// not have stayed there.
				st.Put(k2, v('y'))
				st.RollbackRecord()
				if got := get(t, st); got != string(v('a')) {
					t.Fatalf("after a later record's rollback Get = %q, want the committed value", got)
				}
				// The node's own buffer is back: the next write goes
				// in place again, and is kept.
				st.Put(k, v('d'))
				st.CommitRecord()
				if got := get(t, st); got != string(v('d')) {
					t.Fatalf("Get = %q after a later write, want it", got)
				}
			})
		}
	})

	t.Run("Dirty", func(t *testing.T) {
		st := NewStore(NewMemory())
		st.Put(k, v('a'))
		st.CommitRecord()
		st.Put(k, v('b')) // a record in flight, overwriting in place
		inFlight := st.Dirty()
		if len(inFlight) != 1 || string(inFlight[0].Value) != string(v('a')) {
			t.Fatalf("Dirty with a record in flight = %q, want the committed value", inFlight)
		}
		st.RollbackRecord()
		muts := st.Dirty()
		// Dirty handed the values out: later writes take new bytes and
		// leave the mutations as they were.
		st.Put(k, v('c'))
		st.CommitRecord()
		if string(muts[0].Value) != string(v('a')) {
			t.Fatalf("a write after Dirty changed its mutation to %q", muts[0].Value)
		}
		if got := get(t, st); got != string(v('c')) {
			t.Fatalf("Get = %q, want the last write", got)
		}
		if err := st.Apply(st.Dirty(), Meta{Epoch: 1}); err != nil {
			t.Fatal(err)
		}
		// A new epoch: the first write of k takes new bytes (the
		// backend's value is not the epoch's), the next goes over it.
		st.Put(k, v('e'))
		st.CommitRecord()
		held := st.EpochMemory()
		st.Put(k, v('f'))
		st.CommitRecord()
		if got := st.EpochMemory(); got != held || get(t, st) != string(v('f')) {
			t.Fatalf("second write of the epoch: EpochMemory %d → %d, Get %q", held, got, get(t, st))
		}
		// That write saved 'e' in the record's undo buffer, where the
		// value Dirty gave with a record in flight came from.
		if string(inFlight[0].Value) != string(v('a')) {
			t.Fatalf("the mutation Dirty gave with a record in flight changed to %q", inFlight[0].Value)
		}
		if b, _, _ := st.Backend().Get(k); string(b) != string(v('c')) {
			t.Fatalf("the backend holds %q, want the applied epoch's value", b)
		}
	})

	// An empty value is not written in place: its undo copy would be nil,
	// which Dirty with a record in flight gave as a delete (found by
	// review).
	t.Run("an empty value", func(t *testing.T) {
		st := NewStore(NewMemory())
		st.Put(k, []byte{})
		st.CommitRecord()
		st.Put(k, []byte{})
		muts := st.Dirty()
		if len(muts) != 1 || muts[0].Value == nil {
			t.Fatalf("Dirty with a record in flight = %q, want the committed empty value", muts)
		}
	})

	t.Run("a sealed epoch's values stay", func(t *testing.T) {
		st := NewStore(NewMemory())
		st.Put(k, v('a'))
		st.CommitRecord()
		if err := st.Seal(); err != nil {
			t.Fatal(err)
		}
		sealed := st.sealed.get(k).val
		for _, c := range []byte("bc") {
			st.Put(k, v(c))
			st.CommitRecord()
		}
		if string(sealed) != string(v('a')) || get(t, st) != string(v('c')) {
			t.Fatalf("sealed value %q, Get %q", sealed, get(t, st))
		}
	})
}

// boundScope is a Scope over a store with a fixed record key.
type boundScope struct{ st *Store }

func (s boundScope) Store() *Store { return s.st }
func (boundScope) Key() []byte     { return []byte("k") }
func (boundScope) Now() time.Time  { return time.Time{} }

// An entry over SetMaxEntryBytes fails its record and is not written,
// whether it comes through Put or a typed state whose codec encodes into
// the Store's arena (saveValue), and whether or not the key's value could
// have been written over in place.
func TestEntryOverTheBoundFailsTheRecord(t *testing.T) {
	v := Value("v", Bytes())
	for _, tc := range []struct {
		name  string
		write func(st *Store, val []byte)
	}{
		{"Put", func(st *Store, val []byte) { st.Put([]byte("key"), val) }},
		{"typed, append codec", func(st *Store, val []byte) {
			if err := v.Set(boundScope{st}, val); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := NewStore(NewMemory())
			small, big := bytes.Repeat([]byte("a"), 8), bytes.Repeat([]byte("b"), 64)
			tc.write(st, small)
			st.CommitRecord()
			before := st.Dirty()
			if len(before) != 1 {
				t.Fatalf("the small write: %d mutations, want 1", len(before))
			}
			st.SetMaxEntryBytes(len(before[0].Key) + 16)
			tc.write(st, big)
			if err := st.RecordErr(); !errors.Is(err, ErrValueTooLarge) {
				t.Fatalf("RecordErr after a write over the bound: %v, want ErrValueTooLarge", err)
			}
			st.RollbackRecord()
			got, _, err := st.Get(before[0].Key)
			if err != nil || !bytes.Equal(got, small) {
				t.Fatalf("after the refused write the value is %q (%v), want %q", got, err, small)
			}
			// A value as long as the epoch's, which could go over it in
			// place, is refused as well.
			if err := st.Apply(before, Meta{Epoch: 1}); err != nil {
				t.Fatal(err)
			}
			tc.write(st, small)
			st.CommitRecord()
			st.SetMaxEntryBytes(len(before[0].Key) + 4)
			tc.write(st, bytes.Repeat([]byte("c"), 8))
			if err := st.RecordErr(); !errors.Is(err, ErrValueTooLarge) {
				t.Fatalf("RecordErr after a same-length write over the bound: %v, want ErrValueTooLarge", err)
			}
			st.RollbackRecord()
			if got, _, err := st.Get(before[0].Key); err != nil || !bytes.Equal(got, small) {
				t.Fatalf("after the refused same-length write the value is %q (%v), want %q", got, err, small)
			}
		})
	}
}
