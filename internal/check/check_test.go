package check

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
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

// ReadToEnd reads to where the partitions end when it is called: reading
// committed, the records of committed transactions before the open one
// (not the aborted ones, nor the open one's); reading uncommitted, every
// record written so far.
func TestReadToEnd(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("w"), kgo.DefaultProduceTopic("out"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	// txn writes values in a transaction, then commits it, aborts it
	// or leaves it open.
	txn := func(end string, values ...string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i, v := range values {
			if err := cl.ProduceSync(ctx, &kgo.Record{Partition: int32(i % 2), Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if end != "open" {
			if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(end == "commit")); err != nil {
				t.Fatal(err)
			}
		}
	}
	txn("commit", "c1", "c2", "c3")
	txn("abort", "a1", "a2")
	txn("commit", "c4")
	txn("open", "o1", "o2")
	values := func(level kgo.IsolationLevel) []string {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		recs, err := ReadToEnd(rctx, brokers, "out", level)
		if err != nil {
			t.Fatal(err)
		}
		var vs []string
		for _, r := range recs {
			vs = append(vs, string(r.Value))
		}
		slices.Sort(vs)
		return vs
	}
	if got, want := values(kgo.ReadCommitted()), []string{"c1", "c2", "c3", "c4"}; !slices.Equal(got, want) {
		t.Errorf("read committed: %q, want %q", got, want)
	}
	if got, want := values(kgo.ReadUncommitted()), []string{"a1", "a2", "c1", "c2", "c3", "c4", "o1", "o2"}; !slices.Equal(got, want) {
		t.Errorf("read uncommitted: %q, want %q", got, want)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if got, want := values(kgo.ReadCommitted()), []string{"c1", "c2", "c3", "c4", "o1", "o2"}; !slices.Equal(got, want) {
		t.Errorf("read committed after the commit: %q, want %q", got, want)
	}
}
