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
		n := ws.seek([]byte(seek))
		switch {
		case i == len(keys) && n != nil:
			t.Errorf("seek(%q) = %q, want nil", seek, n.key)
		case i < len(keys) && (n == nil || n.key != keys[i]):
			t.Errorf("seek(%q) = %v, want %q", seek, n, keys[i])
		}
	}
	ws.reset()
	if ws.len() != 0 || ws.first() != nil || ws.seek(nil) != nil {
		t.Fatal("reset left entries")
	}
}
