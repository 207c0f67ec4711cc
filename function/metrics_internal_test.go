package function

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A registry that holds a function job's metrics refuses a second's with
// an error, not a panic, and keeps none of the refused job's metrics.
func TestSharedRegistryIsRefusedClearly(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	before, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg); err == nil || !strings.Contains(err.Error(), "give each a registry of its own") {
		t.Fatalf("second job's metrics: %v, want the registry refused", err)
	}
	after, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("%d metric families after the refusal, want %d", len(after), len(before))
	}
}
