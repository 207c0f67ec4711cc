package check

import (
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
)

func agg(key string, a Aggregation) *kgo.Record {
	b, _ := json.Marshal(a)
	return &kgo.Record{Key: []byte(key), Value: b}
}

// The checks are the judge of every exactly-once test: each must catch a
// duplicate, a loss and a wrong value.
func TestAggregate(t *testing.T) {
	inputs := map[string][]int64{"a": {5, -2, 7}}
	one := Aggregation{Count: 1, Sum: 5, Min: 5, Max: 5}
	two := Aggregation{Count: 2, Sum: 3, Min: -2, Max: 5}
	three := Aggregation{Count: 3, Sum: 10, Min: -2, Max: 7}
	tests := []struct {
		name string
		out  []*kgo.Record
		want Report
	}{
		{"exact", []*kgo.Record{agg("a", one), agg("a", two), agg("a", three)}, Report{Inputs: 3, Outputs: 3}},
		{"duplicate", []*kgo.Record{agg("a", one), agg("a", two), agg("a", two), agg("a", three)}, Report{Inputs: 3, Outputs: 4, Duplicates: 1}},
		{"lost", []*kgo.Record{agg("a", one), agg("a", two)}, Report{Inputs: 3, Outputs: 2, Lost: 1}},
		{"wrong sum", []*kgo.Record{agg("a", one), agg("a", Aggregation{Count: 2, Sum: 4, Min: -2, Max: 5}), agg("a", three)}, Report{Inputs: 3, Outputs: 3, Wrong: 2, Lost: 2}},
		{"unknown key", []*kgo.Record{agg("a", one), agg("a", two), agg("a", three), agg("b", one)}, Report{Inputs: 3, Outputs: 4, Wrong: 1}},
	}
	for _, tt := range tests {
		if got := Aggregate(inputs, tt.out); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestEcho(t *testing.T) {
	in := map[int32][][]byte{0: {[]byte("a"), []byte("b"), []byte("c")}}
	tests := []struct {
		name string
		out  [][]byte
		want Report
	}{
		{"exact", [][]byte{[]byte("a"), []byte("b"), []byte("c")}, Report{Inputs: 3, Outputs: 3}},
		{"replayed", [][]byte{[]byte("a"), []byte("b"), []byte("a"), []byte("b"), []byte("c")}, Report{Inputs: 3, Outputs: 5, Duplicates: 2}},
		{"lost", [][]byte{[]byte("a"), []byte("c")}, Report{Inputs: 3, Outputs: 2, Wrong: 1, Lost: 2}},
	}
	for _, tt := range tests {
		if got := Echo(in, map[int32][][]byte{0: tt.out}); got != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// MetricSum adds the series whose labels match the pairs given, all of
// them without pairs.
func TestMetricSumByLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tasks"}, []string{"state"})
	reg.MustRegister(g)
	g.WithLabelValues("running").Set(3)
	g.WithLabelValues("restoring").Set(2)
	for _, c := range []struct {
		labels []string
		want   float64
	}{{nil, 5}, {[]string{"state", "running"}, 3}, {[]string{"state", "gone"}, 0}} {
		if got, err := MetricSum(reg, "tasks", c.labels...); err != nil || got != c.want {
			t.Errorf("MetricSum(%v) = %v, %v; want %v", c.labels, got, err, c.want)
		}
	}
}
