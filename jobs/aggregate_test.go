package jobs

import (
	"encoding/json"
	"math"
	"sync"
	"testing"
)

// The output must be exactly what encoding/json makes of Aggregation: the
// contract names the fields and outside readers parse it.
func TestAggregationJSONAndCodec(t *testing.T) {
	for _, a := range []Aggregation{
		{},
		{Count: 1, Sum: -5, Min: -5, Max: -5},
		{Count: math.MaxInt64, Sum: math.MinInt64, Min: math.MinInt64, Max: math.MaxInt64},
	} {
		want, _ := json.Marshal(a)
		if got := a.appendJSON(nil); string(got) != string(want) {
			t.Errorf("appendJSON = %s, want %s", got, want)
		}
		b, _ := aggregationCodec{}.Encode(a)
		if back, err := (aggregationCodec{}).Decode(b); err != nil || back != a {
			t.Errorf("codec round trip of %+v: %+v, %v", a, back, err)
		}
	}
	if _, err := (aggregationCodec{}).Decode([]byte{1, 2}); err == nil {
		t.Error("a short value decoded")
	}
}

// Outputs carved from shared chunks stay as they were made while many more
// are made, on several goroutines at once, the longest ones included: no
// two outputs share bytes, and none can grow into the next.
func TestAggregateOutputsDoNotOverlap(t *testing.T) {
	const workers, each = 4, 5000
	outs := make([][][]byte, workers)
	aggs := func(w, i int) Aggregation {
		switch {
		case i%11 == 0: // the longest output there is: maxOutputLen bytes
			return Aggregation{Count: math.MinInt64, Sum: math.MinInt64, Min: math.MinInt64, Max: math.MinInt64}
		case i%7 == 0:
			return Aggregation{Count: math.MaxInt64 - int64(i), Sum: math.MinInt64 + int64(w), Min: math.MinInt64, Max: math.MaxInt64}
		}
		return Aggregation{Count: int64(i), Sum: int64(w*each + i), Min: -int64(i), Max: int64(w)}
	}
	longest := Aggregation{Count: math.MinInt64, Sum: math.MinInt64, Min: math.MinInt64, Max: math.MinInt64}
	if n := len(longest.output()); n != maxOutputLen {
		t.Fatalf("the longest output is %d bytes, maxOutputLen %d", n, maxOutputLen)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				out := aggs(w, i).output()
				if cap(out) != len(out) {
					t.Errorf("output has room to grow: len %d, cap %d", len(out), cap(out))
					return
				}
				outs[w] = append(outs[w], out)
			}
		}()
	}
	wg.Wait()
	for w := range workers {
		for i, got := range outs[w] {
			if want, _ := json.Marshal(aggs(w, i)); string(got) != string(want) {
				t.Fatalf("output %d of goroutine %d = %s, want %s", i, w, got, want)
			}
		}
	}
}
