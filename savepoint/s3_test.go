package savepoint_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"gocloud.dev/blob"
	"gocloud.dev/blob/s3blob"

	_ "github.com/sluicehq/sluice/savepoint/s3"
)

// s3Root starts an in-process S3 server (gofakes3, memory backend) on
// 127.0.0.1 with a bucket "sp" and returns an s3:// location under it. The
// AWS SDK gets static credentials from the environment, so it never looks
// further along its chain (no shared files, no instance metadata).
func s3Root(t *testing.T) string {
	t.Helper()
	loc, _ := s3Server(t)
	return loc
}

// s3Server is s3Root that also counts the parts uploaded by multipart
// uploads.
func s3Server(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	be := s3mem.New()
	if err := be.CreateBucket("sp"); err != nil {
		t.Fatal(err)
	}
	parts := new(atomic.Int64)
	s3 := gofakes3.New(be).Server()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Has("partNumber") {
			parts.Add(1)
		}
		s3.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	none := filepath.Join(t.TempDir(), "none")
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_CONFIG_FILE", none)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", none)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	return "s3://sp/backups?endpoint=" + srv.URL + "&region=us-east-1&use_path_style=true", parts
}

// object reads and rewrites one file of the savepoint at loc, local or S3,
// behind the package's back: damage for the tests.
func object(t *testing.T, loc, name string) (get func() []byte, put func([]byte)) {
	t.Helper()
	ctx := context.Background()
	if !strings.HasPrefix(loc, "s3://") {
		return readFile(t, filepath.Join(loc, name)), writeFile(t, filepath.Join(loc, name))
	}
	u, err := url.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&s3blob.URLOpener{}).OpenBucketURL(ctx, &url.URL{Scheme: "s3", Host: u.Host, RawQuery: u.RawQuery})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	key := strings.TrimPrefix(u.Path, "/") + "/" + name
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

// keys lists the objects under the savepoint at loc (S3 only).
func keys(t *testing.T, loc string) []string {
	t.Helper()
	u, _ := url.Parse(loc)
	b, err := (&s3blob.URLOpener{}).OpenBucketURL(context.Background(), &url.URL{Scheme: "s3", Host: u.Host, RawQuery: u.RawQuery})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var out []string
	it := b.List(&blob.ListOptions{Prefix: strings.TrimPrefix(u.Path, "/") + "/"})
	for {
		obj, err := it.Next(context.Background())
		if err != nil {
			return out
		}
		out = append(out, obj.Key)
	}
}
