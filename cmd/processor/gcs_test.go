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
	// The Cloud Storage client goes; Google's auth packages stay while the
	// Azure driver is in (gocloud's user-agent package imports them).
	for _, p := range deps("-tags", "nogcs") {
		if p == driver || strings.HasPrefix(p, "cloud.google.com/go/storage") || strings.HasPrefix(p, "gocloud.dev/blob/gcsblob") {
			t.Errorf("-tags nogcs builds %s", p)
		}
	}
	for _, p := range deps("-tags", "nogcs noazure") {
		if strings.HasPrefix(p, "cloud.google.com/") || strings.HasPrefix(p, "github.com/Azure/") {
			t.Errorf("-tags 'nogcs noazure' builds %s", p)
		}
	}
}

// The binary has the azblob:// driver; `-tags noazure` builds it without
// the driver and the Azure SDK.
func TestNoAzureTagLeavesOutTheAzureSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "noazure", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p == "github.com/sluicehq/sluice/savepoint/azure" || strings.HasPrefix(p, "github.com/Azure/") {
			t.Errorf("-tags noazure builds %s", p)
		}
	}
}
