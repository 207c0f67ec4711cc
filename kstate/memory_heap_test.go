package kstate

import (
	"fmt"
	"runtime"
	"testing"
)

// TestMemoryHeapBytesEstimate checks Stats.HeapBytes of the memory backend
// against what the heap actually grew by for 100,000 entries of the sizes
// the aggregate job writes, and for larger values.
func TestMemoryHeapBytesEstimate(t *testing.T) {
	for _, sz := range []struct{ key, val int }{{30, 40}, {40, 1000}} {
		t.Run(fmt.Sprintf("key=%d,value=%d", sz.key, sz.val), func(t *testing.T) {
			const n, batch = 100000, 5000
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			be := NewMemory()
			val := make([]byte, sz.val)
			for i := 0; i < n; i += batch {
				muts := make([]Mutation, batch)
				for j := range muts {
					k := fmt.Appendf(nil, "%0*d", sz.key, i+j)
					muts[j] = Mutation{Key: k, Value: val}
				}
				if err := be.Apply(muts, Meta{}); err != nil {
					t.Fatal(err)
				}
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			grew := float64(after.HeapAlloc) - float64(before.HeapAlloc)
			st := be.Stats()
			runtime.KeepAlive(be)
			ratio := float64(st.HeapBytes) / grew
			t.Logf("logical %d B, estimate %d B, heap grew %.0f B: estimate/heap %.2f, heap/logical %.2f",
				st.Bytes, st.HeapBytes, grew, ratio, grew/float64(st.Bytes))
			if ratio < 0.75 || ratio > 1.33 {
				t.Errorf("HeapBytes %d is %.2f× the heap's growth %.0f; want within 0.75–1.33×", st.HeapBytes, ratio, grew)
			}
		})
	}
}
