package main

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The binary has the gs:// driver; `-tags nogcs` builds it without the
// driver and the Google Cloud client.
func TestNoGCSTagLeavesOutTheGoogleClient(t *testing.T) {
	deps := func(tags ...string) []string {
		out, err := exec.Command("go", append(append([]string{"list"}, tags...), "-deps", ".")...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("go list: %v\n%s", err, ee.Stderr)
			}
			t.Fatalf("go list: %v", err)
		}
		return strings.Fields(string(out))
	}
	const driver = "github.com/sluicehq/sluice/savepoint/gcs"
	if !slices.Contains(deps(), driver) {
		t.Fatalf("the binary does not build %s", driver)
	}
	for _, p := range deps("-tags", "nogcs") {
		if p == driver || strings.HasPrefix(p, "cloud.google.com/") {
			t.Errorf("-tags nogcs builds %s", p)
		}
	}
}
