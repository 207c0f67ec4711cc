package kstate

import (
	"bytes"
	"testing"
)

func TestArenaCopiesAreImmutableAndCapped(t *testing.T) {
	var a arena
	x := a.copy([]byte("abc"))
	y := a.copy([]byte("def"))
	if e := a.copy(nil); e == nil || len(e) != 0 {
		t.Fatalf("copy(nil) = %#v, want empty and non-nil", e)
	}
	_ = append(x, 'Z') // capped: must reallocate, not overwrite y
	if string(x) != "abc" || string(y) != "def" {
		t.Fatalf("x, y = %q, %q", x, y)
	}
	big := bytes.Repeat([]byte{1}, arenaMax+1)
	if c := a.copy(big); !bytes.Equal(c, big) || cap(c) != len(big) {
		t.Fatal("large copy differs")
	}
	// Filling chunks moves on to new ones without disturbing old copies.
	var kept [][]byte
	for i := range 3 * arenaChunk / 100 {
		kept = append(kept, a.copy(bytes.Repeat([]byte{byte(i)}, 100)))
	}
	for i, k := range kept {
		if !bytes.Equal(k, bytes.Repeat([]byte{byte(i)}, 100)) {
			t.Fatalf("copy %d overwritten", i)
		}
	}
}

func TestArenaKeep(t *testing.T) {
	var a arena
	// In place: claimed from the chunk.
	b := a.keep(append(a.free(), "encoded"...))
	next := a.keep(append(a.free(), "next"...))
	if string(b) != "encoded" || string(next) != "next" || cap(b) != len(b) {
		t.Fatalf("b, next = %q, %q", b, next)
	}
	// A part of what was appended, not at its start: copied out, so the
	// free space handed out again cannot overwrite it.
	enc := append(a.free(), "xxpart"...)
	part := a.keep(enc[2:])
	_ = a.keep(append(a.free(), "overwrite"...))
	if string(part) != "part" {
		t.Fatalf("part = %q", part)
	}
	// An encoding that outgrew the free space is its own allocation.
	huge := a.keep(append(a.free(), bytes.Repeat([]byte{7}, arenaChunk)...))
	if len(huge) != arenaChunk || string(b) != "encoded" {
		t.Fatal("outgrown encoding")
	}
	if e := a.keep(a.free()); e == nil || len(e) != 0 {
		t.Fatalf("keep of an empty encoding = %#v", e)
	}
}

// Writes made inside a scan are held apart and the scan goes on over the
// state as it was; a direct write after the scan wins over them; a
// rollback undoes both kinds, including keys new to the epoch.
func TestStoreWritesDuringScanAndRollback(t *testing.T) {
	st := NewStore(NewMemory())
	st.Put([]byte("p/a"), []byte("1"))
	st.Put([]byte("p/b"), []byte("1"))
	st.CommitRecord()

	var seen []string
	err := st.Scan([]byte("p/"), func(k, v []byte) error {
		seen = append(seen, string(k)+"="+string(v))
		st.Put([]byte("p/c"), []byte("scan")) // after the cursor: not seen
		st.Put([]byte("p/b"), []byte("scan")) // ahead: still seen as 1
		st.Delete([]byte("p/a"))
		return nil
	})
	if err != nil || len(seen) != 2 || seen[0] != "p/a=1" || seen[1] != "p/b=1" {
		t.Fatalf("scan saw %q, %v", seen, err)
	}
	if v, ok, _ := st.Get([]byte("p/b")); !ok || string(v) != "scan" {
		t.Fatalf("p/b = %q, %v after the scan", v, ok)
	}
	st.Put([]byte("p/b"), []byte("direct"))
	if v, _, _ := st.Get([]byte("p/b")); string(v) != "direct" {
		t.Fatalf("p/b = %q, want the later direct write", v)
	}
	if _, ok, _ := st.Get([]byte("p/a")); ok {
		t.Fatal("p/a deleted in the scan is still there")
	}
	if n := st.DirtyLen(); n != 2 {
		t.Fatalf("DirtyLen = %d during the record, want the 2 committed", n)
	}
	st.RollbackRecord()
	for k, want := range map[string]string{"p/a": "1", "p/b": "1", "p/c": ""} {
		v, ok, _ := st.Get([]byte(k))
		if string(v) != want || ok != (want != "") {
			t.Fatalf("after rollback %s = %q, %v, want %q", k, v, ok, want)
		}
	}
	if n, b := st.DirtyLen(), st.DirtyBytes(); n != 2 || b != 8 {
		t.Fatalf("DirtyLen, DirtyBytes = %d, %d after rollback, want 2, 8", n, b)
	}
	if d := st.Dirty(); len(d) != 2 || string(d[0].Key) != "p/a" || string(d[1].Key) != "p/b" {
		t.Fatalf("Dirty = %v", d)
	}

	// Committed this time: the scan-time and direct writes both land.
	_ = st.Scan([]byte("p/"), func(k, v []byte) error {
		st.Put([]byte("p/z"), []byte("scan"))
		return ErrStopScan
	})
	st.Put([]byte("q"), []byte("direct"))
	st.CommitRecord()
	if d := st.Dirty(); len(d) != 4 || string(d[2].Key) != "p/z" || string(d[3].Key) != "q" {
		t.Fatalf("Dirty = %v", d)
	}
}

// An AppendCodec that ignores dst and returns a buffer it writes again
// must not have that buffer become state.
func TestArenaKeepCopiesForeignBuffers(t *testing.T) {
	var a arena
	own := []byte("first")
	kept := a.keep(own)
	copy(own, "XXXXX")
	if string(kept) != "first" {
		t.Fatalf("kept = %q: the encoder's own buffer became state", kept)
	}
}

// A write-set whose writes mostly overwrite a few keys holds arena chunks
// alive for the few values written once: EpochMemory counts them, so the
// epoch budget sees what DirtyBytes does not. (The values change length
// from write to write: a write of the same length goes over the old value
// in place, TestOverwriteInPlace.)
func TestEpochMemoryCountsHeldChunks(t *testing.T) {
	st := NewStore(NewMemory())
	for i := range 20_000 {
		k := []byte{byte(i % 10)}
		if i%100 == 0 {
			k = []byte("unique-" + string(rune('a'+i/100%26)) + string(rune(i)))
		}
		st.Put(k, bytes.Repeat([]byte{1}, 200+i/10%2))
		st.CommitRecord()
	}
	if st.EpochMemory() < 20_000*200 {
		t.Fatalf("EpochMemory = %d for 20,000 writes of 200 bytes (DirtyBytes %d)", st.EpochMemory(), st.DirtyBytes())
	}
	st.Discard()
	if st.EpochMemory() != 0 {
		t.Fatalf("EpochMemory = %d after Discard", st.EpochMemory())
	}
}

func TestApplyAndRewriteRefuseARecordInFlight(t *testing.T) {
	st := NewStore(NewMemory())
	st.Put([]byte("k"), []byte("v"))
	if err := st.Apply(st.Dirty(), Meta{Epoch: 1}); err == nil {
		t.Fatal("Apply with a record in flight succeeded")
	}
	if err := st.Rewrite([]byte("j")); err == nil {
		t.Fatal("Rewrite with a record in flight succeeded")
	}
	st.CommitRecord()
	if err := st.Apply(st.Dirty(), Meta{Epoch: 1}); err != nil {
		t.Fatal(err)
	}
}

// A hot key's value is written over in place in the epochs after the
// first too, once its node was kept (writeSet.reset) and its first write
// of the epoch made it its own again: the epoch takes no new memory for
// the writes that follow.
func TestOverwriteInPlaceAfterAnEpochKeptTheNode(t *testing.T) {
	st := NewStore(NewMemory())
	k := []byte("hot")
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 64) }
	for epoch := range 3 {
		st.Put(k, val(0))
		st.CommitRecord()
		m := st.EpochMemory()
		for i := range 2000 {
			st.Put(k, val(i))
			st.CommitRecord()
		}
		if st.EpochMemory() != m {
			t.Fatalf("epoch %d: EpochMemory %d → %d over 2,000 writes of the same length", epoch, m, st.EpochMemory())
		}
		if err := st.Apply(st.Dirty(), Meta{Epoch: uint64(epoch + 1)}); err != nil {
			t.Fatal(err)
		}
	}
}
