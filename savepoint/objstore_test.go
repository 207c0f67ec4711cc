package savepoint_test

import (
	"context"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"gocloud.dev/blob"
	"gocloud.dev/blob/azureblob"
	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/blob/s3blob"
	"gocloud.dev/gcp"

	"github.com/sluicehq/sluice/internal/objtest"
	_ "github.com/sluicehq/sluice/savepoint/azure"
	_ "github.com/sluicehq/sluice/savepoint/gcs"
	_ "github.com/sluicehq/sluice/savepoint/s3"
)

// s3Root and gcsRoot are the object stores' roots for eachStore.
func s3Root(t *testing.T) string {
	loc, _ := objtest.S3(t)
	return loc
}

func gcsRoot(t *testing.T) string {
	loc, _ := objtest.GCS(t)
	return loc
}

func azureRoot(t *testing.T) string {
	loc, _ := objtest.Azure(t)
	return loc
}

// bucket opens the bucket of the object store location loc behind the
// package's back, and returns it with loc's key prefix.
func bucket(t *testing.T, loc string) (*blob.Bucket, string) {
	t.Helper()
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	bu := &url.URL{Scheme: u.Scheme, Host: u.Host, RawQuery: u.RawQuery}
	var b *blob.Bucket
	switch u.Scheme {
	case "s3":
		b, err = (&s3blob.URLOpener{}).OpenBucketURL(context.Background(), bu)
	case "gs":
		b, err = (&gcsblob.URLOpener{Client: gcp.NewAnonymousHTTPClient(gcp.DefaultTransport())}).OpenBucketURL(context.Background(), bu)
	case "azblob":
		b, err = (&azureblob.URLOpener{MakeClient: azureblob.NewDefaultClient, ServiceURLOptions: *azureblob.NewDefaultServiceURLOptions()}).OpenBucketURL(context.Background(), bu)
	default:
		t.Fatalf("%s is not an object store's location", loc)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, strings.TrimPrefix(u.Path, "/") + "/"
}

// objectStore reports whether loc is in an object store.
func objectStore(loc string) bool {
	return strings.HasPrefix(loc, "s3://") || strings.HasPrefix(loc, "gs://") || strings.HasPrefix(loc, "azblob://")
}

// object reads and rewrites one file of the savepoint at loc, local or in
// an object store, behind the package's back: damage for the tests.
func object(t *testing.T, loc, name string) (get func() []byte, put func([]byte)) {
	t.Helper()
	ctx := context.Background()
	if !objectStore(loc) {
		return readFile(t, filepath.Join(loc, name)), writeFile(t, filepath.Join(loc, name))
	}
	b, prefix := bucket(t, loc)
	key := prefix + name
	return func() []byte {
			data, err := b.ReadAll(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}, func(data []byte) {
			if err := b.WriteAll(ctx, key, data, nil); err != nil {
				t.Fatal(err)
			}
		}
}

// keys lists the objects under the savepoint at loc (object stores only).
func keys(t *testing.T, loc string) []string {
	t.Helper()
	b, prefix := bucket(t, loc)
	var out []string
	it := b.List(&blob.ListOptions{Prefix: prefix})
	for {
		obj, err := it.Next(context.Background())
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, obj.Key)
	}
}
