package join

import (
	"cmp"
	"math"
	"math/rand/v2"
	"testing"
)

// Entry keys sort as their (time, partition, offset) do, which the scans'
// early stops rely on, and decode to what was encoded.
func TestEntryKeyOrderAndRoundTrip(t *testing.T) {
	type entry struct {
		ts        int64
		partition int32
		offset    int64
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() entry {
		ts := []int64{math.MinInt64, -1, 0, 1, math.MaxInt64, rng.Int64() - math.MaxInt64/2, rng.Int64N(3)}[rng.IntN(7)]
		return entry{ts, int32(rng.IntN(3)), rng.Int64N(3)}
	}
	compare := func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.ts, b.ts), cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
	}
	for range 10000 {
		a, b := pick(), pick()
		ka, kb := entryKey(a.ts, a.partition, a.offset), entryKey(b.ts, b.partition, b.offset)
		if got, want := cmp.Compare(ka, kb), compare(a, b); got != want {
			t.Fatalf("%+v vs %+v: keys compare %d, entries %d", a, b, got, want)
		}
		ts, p, off, err := decodeEntryKey(ka)
		if err != nil || (entry{ts, p, off}) != a {
			t.Fatalf("%+v decoded as %d %d %d, %v", a, ts, p, off, err)
		}
	}
	if _, _, _, err := decodeEntryKey("short"); err == nil {
		t.Fatal("a key of 5 bytes decoded")
	}
}
