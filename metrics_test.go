package sluice

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The transaction results exist before the first epoch ends, so an alert
// on increase(sluice_transactions_total{result="abort"}) sees the first
// abort.
func TestTransactionSeriesExistFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg, &Instance{})
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
