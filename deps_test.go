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
// with savepoint/s3, gs:// ones with savepoint/gcs and azblob:// ones with
// savepoint/azure, which only the
// programs that want them import (the processor binary does). The AWS SDK, gocloud, gRPC and OpenTelemetry
// were some forty of the fifty-odd modules a one-line program importing
// the engine was built from.
func TestEngineDoesNotBuildObjectStoreSDKs(t *testing.T) {
	pkgs := []string{".", "./kstate", "./window", "./join", "./jobs", "./txsink", "./savepoint", "./sluicetest", "./barrier", "./changelog"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, heavy := range []string{"github.com/aws/", "cloud.google.com/", "github.com/Azure/", "gocloud.dev/", "google.golang.org/grpc", "go.opentelemetry.io/", "github.com/jackc/pgx", "connectrpc.com/"} {
			if strings.HasPrefix(p, heavy) {
				t.Errorf("%s builds %s", strings.Join(pkgs, " "), p)
			}
		}
	}
}

// Without its driver, an s3://, gs:// or azblob:// RestoreFrom fails with an error
// that names the import, not as an unknown scheme.
func TestObjectStoreSavepointWithoutTheDriverSaysWhatToImport(t *testing.T) {
	for _, tt := range []struct{ loc, pkg string }{
		{"s3://bucket/backups/sp-1", "github.com/sluicehq/sluice/savepoint/s3"},
		{"gs://bucket/backups/sp-1", "github.com/sluicehq/sluice/savepoint/gcs"},
		{"azblob://container/backups/sp-1", "github.com/sluicehq/sluice/savepoint/azure"},
	} {
		in := &Instance{cfg: Options{RestoreFrom: tt.loc}}
		_, err := in.openSeed(context.Background())
		var re *RestoreError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), `import _ "`+tt.pkg+`"`) {
			t.Errorf("openSeed(%s) = %v, want a *RestoreError naming %s", tt.loc, err, tt.pkg)
		}
		if err := savepoint.CheckLocation(context.Background(), tt.loc); !errors.Is(err, savepoint.ErrLocation) {
			t.Errorf("CheckLocation(%s) = %v, want ErrLocation", tt.loc, err)
		}
	}
}
