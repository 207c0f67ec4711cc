package sluice

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The transaction results exist before the first epoch ends, so an alert
// on increase(sluice_transactions_total{result="abort"}) sees the first
// abort.
func TestTransactionSeriesExistFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg, &Instance{}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_transactions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					results[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if v, ok := results["abort"]; !ok || v != 0 || len(results) != 2 {
		t.Fatalf("sluice_transactions_total at start: %v, want commit and abort at 0", results)
	}
}

// A registry that holds an Instance's metrics refuses a second Instance's
// with an error that says what to do, not a panic, and keeps none of the
// refused instance's metrics; one registry wrapped for each with a label
// value of its own takes both.
func TestSharedRegistryIsRefusedClearly(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg, &Instance{}); err != nil {
		t.Fatal(err)
	}
	before, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	_, err = newMetrics(reg, &Instance{})
	if err == nil || !strings.Contains(err.Error(), "give each Instance a registry of its own") {
		t.Fatalf("second instance's metrics: %v, want the registry refused", err)
	}
	after, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("%d metric families after the refusal, want %d", len(after), len(before))
	}
	shared := prometheus.NewRegistry()
	for _, id := range []string{"a", "b"} {
		wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"instance": id}, shared)
		if _, err := newMetrics(wrapped, &Instance{}); err != nil {
			t.Fatalf("instance %s in a wrapped registry: %v", id, err)
		}
	}
}
