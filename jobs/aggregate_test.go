package jobs

import (
	"encoding/json"
	"math"
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
