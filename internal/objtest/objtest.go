// Package objtest starts object stores that speak the real protocols, for
// the tests of savepoints in S3, Google Cloud Storage and Azure Blob
// Storage: gofakes3 (the S3 REST API) and fake-gcs-server (the GCS JSON
// API) in process, and Azurite (Microsoft's emulator of the Blob REST API,
// a Node.js program) as a child process, each in memory on 127.0.0.1 with
// a bucket (container) "sp". Only tests import it.
package objtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

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

// AzuriteVersion is the Azurite that .ci/run installs (npm install -g
// azurite@AzuriteVersion) and Azure's tests need.
const AzuriteVersion = "3.35.0"

// azuriteKey is the shared key of Azurite's well-known account
// devstoreaccount1, the same in every Azurite.
const azuriteKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

// Azure gives the test a container of its own in Azurite's blob service
// (azurite-blob: $AZURITE_BLOB, or on PATH), which starts in memory with
// the test binary's first call and serves the rest, behind a proxy in this
// process that counts the blocks of block uploads. It sets the account's
// shared key in the environment (AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY)
// and returns an azblob:// location under the container, and the count of
// its blocks. Without Azurite the test fails, saying how to install it,
// rather than skip.
func Azure(t testing.TB) (string, *atomic.Int64) {
	t.Helper()
	az, err := startAzurite()
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("sp%d", az.containers.Add(1))
	blocks := new(atomic.Int64)
	az.blocks.Store(name, blocks)
	c, err := container.NewClientWithSharedKeyCredential(az.url+"/"+azuriteAccount+"/"+name, az.cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AZURE_STORAGE_ACCOUNT", azuriteAccount)
	t.Setenv("AZURE_STORAGE_KEY", azuriteKey)
	return "azblob://" + name + "/backups?localemu=true&protocol=http&domain=" + strings.TrimPrefix(az.url, "http://"), blocks
}

const azuriteAccount = "devstoreaccount1"

// azurite is the test binary's Azurite, behind its proxy at url.
type azurite struct {
	url        string
	cred       *azblob.SharedKeyCredential
	containers atomic.Int64
	blocks     sync.Map // container name → *atomic.Int64
}

var startAzurite = sync.OnceValues(func() (*azurite, error) {
	bin := os.Getenv("AZURITE_BLOB")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("azurite-blob"); err != nil {
			return nil, fmt.Errorf("Azurite is needed for the Azure Blob Storage tests (.ci/run installs it: npm install -g azurite@%s; or set AZURITE_BLOB): %v", AzuriteVersion, err)
		}
	}
	cmd := exec.Command(bin, "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence", "--skipApiVersionCheck", "--loose", "--disableTelemetry")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	// It lives as long as the test binary, which kills it when it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// The port it listens on is in a line of its output, which is read
	// to its end so that it never blocks on a full pipe.
	listening := regexp.MustCompile(`listens on (http://127\.0\.0\.1:\d+)`)
	found := make(chan string, 1)
	said := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var before strings.Builder
		sent := false
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil && !sent {
				found <- m[1]
				sent = true
			} else if !sent {
				before.WriteString(sc.Text() + "\n")
			}
		}
		if !sent {
			said <- before.String()
		}
	}()
	var target string
	select {
	case target = <-found:
	case s := <-said:
		return nil, fmt.Errorf("azurite-blob exited without listening:\n%s", s)
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		return nil, errors.New("azurite-blob does not listen after 2 minutes")
	}
	backend, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	cred, err := azblob.NewSharedKeyCredential(azuriteAccount, azuriteKey)
	if err != nil {
		return nil, err
	}
	az := &azurite{cred: cred}
	proxy := httputil.NewSingleHostReverseProxy(backend)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Get("comp") == "block" {
			// /devstoreaccount1/<container>/<blob>
			parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
			if len(parts) > 1 {
				if n, ok := az.blocks.Load(parts[1]); ok {
					n.(*atomic.Int64).Add(1)
				}
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	az.url = "http://" + ln.Addr().String()
	return az, nil
})
