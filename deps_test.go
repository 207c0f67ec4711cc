package sluice

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/savepoint"
)

// A program that imports the engine, or the packages a job is written
// with, is not built with an object store's SDK: s3:// savepoints come
// with savepoint/s3, which only the programs that want them import (the
// processor binary does). The AWS SDK, gocloud, gRPC and OpenTelemetry
// were some forty of the fifty-odd modules a one-line program importing
// the engine was built from.
func TestEngineDoesNotBuildObjectStoreSDKs(t *testing.T) {
	pkgs := []string{".", "./kstate", "./window", "./jobs", "./txsink", "./savepoint", "./sluicetest", "./barrier", "./changelog"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, heavy := range []string{"github.com/aws/", "gocloud.dev/", "google.golang.org/grpc", "go.opentelemetry.io/", "github.com/jackc/pgx", "connectrpc.com/"} {
			if strings.HasPrefix(p, heavy) {
				t.Errorf("%s builds %s", strings.Join(pkgs, " "), p)
			}
		}
	}
}

// Without savepoint/s3, an s3:// RestoreFrom fails with an error that
// names the import, not as an unknown scheme.
func TestS3SavepointWithoutTheDriverSaysWhatToImport(t *testing.T) {
	in := &Instance{cfg: Options{RestoreFrom: "s3://bucket/backups/sp-1"}}
	_, err := in.openSeed(context.Background())
	var re *RestoreError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), `import _ "github.com/sluicehq/sluice/savepoint/s3"`) {
		t.Fatalf("openSeed = %v, want a *RestoreError naming savepoint/s3", err)
	}
	if err := savepoint.CheckLocation(context.Background(), "s3://bucket/backups"); !errors.Is(err, savepoint.ErrLocation) {
		t.Fatalf("CheckLocation = %v, want ErrLocation", err)
	}
}
