// Package objtest starts in-process object stores that speak the real
// protocols, for the tests of savepoints in S3 and Google Cloud Storage:
// gofakes3 (the S3 REST API) and fake-gcs-server (the GCS JSON API), each
// in memory on 127.0.0.1 with a bucket "sp". Only tests import it.
package objtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// S3 starts an S3 server and returns an s3:// location under its bucket
// "sp", and the count of parts uploaded by multipart uploads. The AWS SDK
// gets static credentials from the environment, so it never looks further
// along its chain (no shared files, no instance metadata).
func S3(t testing.TB) (string, *atomic.Int64) {
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

// GCS starts a Google Cloud Storage server, points the savepoint/gcs
// driver at it (STORAGE_EMULATOR_HOST: unauthenticated, the JSON API over
// HTTP), and returns a gs:// location under its bucket "sp", and the count
// of chunks uploaded by resumable uploads.
func GCS(t testing.TB) (string, *atomic.Int64) {
	t.Helper()
	hs := httptest.NewUnstartedServer(nil)
	url := "http://" + hs.Listener.Addr().String()
	// ExternalURL: where a resumable upload's chunks go. PublicHost: the
	// server routes object downloads by host, and the client asks
	// 127.0.0.1:port for them.
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true, Scheme: "http",
		ExternalURL: url, PublicHost: "127.0.0.1", Writer: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	chunks := new(atomic.Int64)
	h := srv.HTTPHandler()
	hs.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("upload_id") && r.Header.Get("Content-Range") != "" {
			chunks.Add(1)
		}
		h.ServeHTTP(w, r)
	})
	hs.Start()
	t.Cleanup(hs.Close)
	t.Cleanup(srv.Stop)
	srv.CreateBucket("sp")
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(url, "http://"))
	return "gs://sp/backups", chunks
}
