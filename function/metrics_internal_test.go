package function

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A registry that holds a function job's metrics refuses a second's with
// an error, not a panic. A refusal registers nothing: here the last
// metric's name is taken, and none of the ones before it stays.
func TestSharedRegistryIsRefusedClearly(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg); err == nil || !strings.Contains(err.Error(), "give each a registry of its own") {
		t.Fatalf("second job's metrics: %v, want the registry refused", err)
	}

	taken := prometheus.NewRegistry()
	if err := taken.Register(prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_function_retries_total", Help: "taken"})); err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(taken); err == nil {
		t.Fatal("registered over a taken name")
	}
	mfs, err := taken.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 {
		t.Fatalf("after the refusal the registry holds %d metric families, want only the name taken before", len(mfs))
	}
}
