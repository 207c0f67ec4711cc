package kstate

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestWriteSetOrderAndSeek(t *testing.T) {
	ws := newWriteSet()
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string][]byte{}
	for i := range 5000 {
		k := fmt.Sprintf("k%05d", rng.IntN(3000))
		var v []byte
		if i%7 != 0 {
			v = []byte{byte(i)}
		}
		ws.set(k, v)
		want[k] = v
	}
	if ws.len() != len(want) {
		t.Fatalf("len = %d, want %d", ws.len(), len(want))
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
	})
	var got []string
	for n := ws.first(); n != nil; n = n.next[0] {
		got = append(got, n.key)
		if string(n.val) != string(want[n.key]) || (n.val == nil) != (want[n.key] == nil) {
			t.Fatalf("%s = %v, want %v", n.key, n.val, want[n.key])
		}
	}
	if !slices.Equal(got, keys) {
		t.Fatal("skip list order differs from sorted keys")
	}
	for _, seek := range []string{"", "k0", "k01", "k01500", "k015005", "k3", "l"} {
		i, _ := slices.BinarySearch(keys, seek)
		n := ws.seek([]byte(seek), "")
		switch {
		case i == len(keys) && n != nil:
			t.Errorf("seek(%q) = %q, want nil", seek, n.key)
		case i < len(keys) && (n == nil || n.key != keys[i]):
			t.Errorf("seek(%q) = %v, want %q", seek, n, keys[i])
		}
	}
	ws.reset()
	if ws.len() != 0 || ws.first() != nil || ws.seek(nil, "") != nil {
		t.Fatal("reset left entries")
	}
}

// reset keeps the nodes of a write-set whose keys were mostly set, unset
// and with their keys, so the next epoch's first write of a key finds its
// node; a write-set whose nodes were mostly unset is emptied, so unset
// nodes never outnumber set ones for long.
func TestWriteSetResetKeepsNodesOfHotKeys(t *testing.T) {
	ws := newWriteSet()
	for i := range 100 {
		ws.set(fmt.Sprintf("k%03d", i), []byte{byte(i)})
	}
	if ws.held() == 0 {
		t.Fatal("held = 0 after 100 new keys")
	}
	ws.reset()
	if len(ws.index) != 100 || ws.len() != 0 || ws.bytes != 0 || ws.first() != nil || ws.seek([]byte("k05"), "") != nil {
		t.Fatalf("after reset: %d nodes kept, len %d, bytes %d, first %v", len(ws.index), ws.len(), ws.bytes, ws.first())
	}
	if ws.held() != 0 {
		t.Fatalf("held = %d after reset: the memory kept is not this epoch's", ws.held())
	}
	for n := ws.head.next[0]; n != nil; n = n.next[0] {
		if !n.unset || n.val != nil || n.own {
			t.Fatalf("kept node %q: unset %v, val %v, own %v", n.key, n.unset, n.val, n.own)
		}
	}

	// The next epoch writes 90 of the keys again, each into its kept node
	// with no new memory, and 10 new ones; walks see only what this epoch
	// set, in order.
	n0 := ws.index["k000"]
	for i := range 90 {
		ws.set(fmt.Sprintf("k%03d", i), []byte{1, byte(i)})
	}
	if ws.index["k000"] != n0 || ws.held() != 0 {
		t.Fatalf("a kept key's write took a new node (%v) or memory (%d)", ws.index["k000"] != n0, ws.held())
	}
	for i := range 10 {
		ws.set(fmt.Sprintf("n%03d", i), nil)
	}
	var got []string
	for n := ws.first(); n != nil; n = n.after() {
		got = append(got, n.key)
	}
	if len(got) != 100 || got[0] != "k000" || got[89] != "k089" || got[90] != "n000" || ws.len() != 100 {
		t.Fatalf("walk after reset = %d keys (len %d): %v", len(got), ws.len(), got)
	}
	if n := ws.seek([]byte("k0895"), ""); n == nil || n.key != "n000" {
		t.Fatalf("seek(k0895) = %v, want n000", n)
	}
	if ws.get([]byte("k095")) != nil || ws.get([]byte("k005")) == nil {
		t.Fatal("get sees a kept node that is unset, or misses one set again")
	}

	// 100 set of 110: kept again. Then an epoch sets 80 of them (under
	// three quarters): emptied.
	ws.reset()
	if len(ws.index) != 110 {
		t.Fatalf("second reset kept %d nodes, want 110", len(ws.index))
	}
	for i := range 80 {
		ws.set(fmt.Sprintf("k%03d", i), []byte{2})
	}
	ws.reset()
	if len(ws.index) != 0 || ws.head.next[0] != nil || ws.held() != 0 {
		t.Fatalf("a write-set with 80 of 110 nodes set kept %d nodes", len(ws.index))
	}
}

// seek and afterWithin step over the unset nodes of the prefix only: a
// scan of a range the epoch has not written stops at the range's end,
// not at the next set node after it.
func TestWriteSetSeekStopsAtThePrefix(t *testing.T) {
	ws := newWriteSet()
	for _, k := range []string{"a1", "a2", "b1", "b2", "c1"} {
		ws.set(k, []byte(k))
	}
	ws.reset()
	ws.set("a1", []byte("x"))
	ws.set("c1", []byte("y"))
	if n := ws.seek([]byte("b"), "b"); n != nil {
		t.Fatalf("seek(b) under b = %q, want nil (b1 and b2 are unset)", n.key)
	}
	if n := ws.seek([]byte("a"), "a"); n == nil || n.key != "a1" {
		t.Fatalf("seek(a) under a = %v, want a1", n)
	}
	if n := ws.index["a1"].afterWithin("a"); n != nil {
		t.Fatalf("after a1 under a = %q, want nil (a2 is unset)", n.key)
	}
	if n := ws.seek([]byte("a2"), ""); n == nil || n.key != "c1" {
		t.Fatalf("seek(a2) = %v, want c1", n)
	}
}

// A write-set of more than keepMaxNodes nodes, or whose keys and nodes
// took more than keepMaxBytes, is emptied even when every node was set.
func TestWriteSetResetDropsLargeOnes(t *testing.T) {
	ws := newWriteSet()
	for i := range keepMaxNodes + 1 {
		ws.set(fmt.Sprintf("k%06d", i), []byte{1})
	}
	ws.reset()
	if len(ws.index) != 0 {
		t.Fatalf("a write-set of %d set nodes kept %d", keepMaxNodes+1, len(ws.index))
	}
	big := make([]byte, 2048)
	for i := range keepMaxBytes / len(big) {
		ws.set(fmt.Sprintf("%06d%s", i, big), []byte{1})
	}
	if len(ws.index) > keepMaxNodes || ws.keys.held+ws.nodesHeld <= keepMaxBytes {
		t.Fatalf("the test's keys: %d nodes, %d bytes", len(ws.index), ws.keys.held+ws.nodesHeld)
	}
	ws.reset()
	if len(ws.index) != 0 {
		t.Fatalf("a write-set of %d bytes of keys and nodes kept %d nodes", keepMaxBytes, len(ws.index))
	}
}
