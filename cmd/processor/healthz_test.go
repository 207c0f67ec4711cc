package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluicehq/sluice"
)

// portOf is ":port" of a test server's 127.0.0.1 address: SLUICE_METRICS_ADDR
// as a container sets it, listening on every interface.
func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return ":" + port
}

func healthz(args []string, metricsAddr string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = runHealthz(args, map[string]string{"SLUICE_METRICS_ADDR": metricsAddr}, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHealthz(t *testing.T) {
	var (
		mu    sync.Mutex
		paths []string // requested since the last take
	)
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		p := paths
		paths = nil
		return p
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		switch r.URL.Path {
		case "/healthz":
			fmt.Fprintln(w, "ok")
		case "/readyz":
			http.Error(w, "not ready: restoring\nsecond line", http.StatusServiceUnavailable)
		case "/moved":
			http.Redirect(w, r, "/healthz", http.StatusFound)
		case "/hang":
			<-r.Context().Done() // until the client gives up
		}
	}))
	defer srv.Close()
	addr := portOf(t, srv.Listener.Addr().String())
	closed := portOf(t, freeAddr(t)) // nothing listens there any more

	tests := []struct {
		name      string
		args      []string
		addr      string
		code      int
		path      string // requested, "" for none
		out, errs string // in stdout, in stderr
	}{
		{"live", nil, addr, 0, "/healthz", "127.0.0.1" + addr + "/healthz: 200 ok", ""},
		{"listening on all IPv4 interfaces", nil, "0.0.0.0" + addr, 0, "/healthz", "200 ok", ""},
		{"listening on 127.0.0.1", nil, "127.0.0.1" + addr, 0, "/healthz", "200 ok", ""},
		{"not ready, --ready", []string{"--ready"}, addr, 1, "/readyz", "", "/readyz: 503 not ready: restoring\n"},
		{"not ready, -ready", []string{"-ready"}, addr, 1, "/readyz", "", "503 not ready: restoring"},
		{"nothing listening", nil, closed, 1, "", "", "connection refused"},
		{"port 0", nil, ":0", 1, "", "", `SLUICE_METRICS_ADDR=":0": expected`},
		{"not an address", nil, "metrics", 1, "", "", `SLUICE_METRICS_ADDR="metrics": expected`},
		{"unexpected argument", []string{"ready"}, addr, 1, "", "", `unexpected argument "ready"`},
		{"unknown flag", []string{"--live"}, addr, 1, "", "", "processor healthz: flag provided but not defined: -live\n"},
		{"zero timeout", []string{"--timeout=0s"}, addr, 1, "", "", "--timeout=0s: expected"},
		{"help", []string{"-h"}, addr, 0, "", "usage: processor healthz", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			take()
			code, out, errs := healthz(tt.args, tt.addr)
			paths := take()
			if code != tt.code {
				t.Errorf("exit %d, want %d (stdout %q, stderr %q)", code, tt.code, out, errs)
			}
			if want := []string{tt.path}; tt.path != "" && !slices.Equal(paths, want) {
				t.Errorf("requested %q, want %q", paths, want)
			}
			if tt.path == "" && len(paths) > 0 {
				t.Errorf("requested %q, want nothing", paths)
			}
			if !strings.Contains(out, tt.out) || (tt.out == "" && out != "") {
				t.Errorf("stdout %q, want %q", out, tt.out)
			}
			if !strings.Contains(errs, tt.errs) || (tt.errs == "" && errs != "") {
				t.Errorf("stderr %q, want %q", errs, tt.errs)
			}
			// One line, for docker inspect and the Kubernetes events.
			if msg := out + errs; tt.name != "help" && strings.Count(msg, "\n") != 1 {
				t.Errorf("want one line, got %q", msg)
			}
		})
	}

	// A redirect is not followed: only the processor's own 200 counts.
	t.Run("redirect", func(t *testing.T) {
		url, err := healthzURL(addr, "/moved")
		if err != nil {
			t.Fatal(err)
		}
		if code, _, err := probe(url, healthzTimeout); err != nil || code != http.StatusFound {
			t.Fatalf("probe of a redirect: %d, %v; want 302", code, err)
		}
	})
	// A processor that does not answer fails the check within the timeout.
	t.Run("timeout", func(t *testing.T) {
		url, err := healthzURL(addr, "/hang")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := probe(url, 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no answer within 50ms") {
			t.Fatalf("probe of a hanging server: %v", err)
		}
	})
}

func TestHealthzURL(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"", "http://127.0.0.1:9090/healthz"}, // Config's default, :9090
		{":9090", "http://127.0.0.1:9090/healthz"},
		{"0.0.0.0:8080", "http://127.0.0.1:8080/healthz"},
		{"[::]:8080", "http://127.0.0.1:8080/healthz"},
		{"127.0.0.1:8080", "http://127.0.0.1:8080/healthz"},
		{"[::1]:8080", "http://[::1]:8080/healthz"},
		{"10.1.2.3:8080", "http://10.1.2.3:8080/healthz"},
		{"localhost:8080", "http://localhost:8080/healthz"},
	}
	for _, tt := range tests {
		got, err := healthzURL(tt.addr, "/healthz")
		if err != nil || got != tt.want {
			t.Errorf("healthzURL(%q) = %q, %v; want %q", tt.addr, got, err, tt.want)
		}
	}
}

// The command against the handler serve installs: live as soon as the
// process serves, not ready before the instance has joined and restored.
func TestHealthzAgainstTheProcessorHandler(t *testing.T) {
	cfg, err := loadConfig(map[string]string{
		"SLUICE_BROKERS": "127.0.0.1:1", "SLUICE_APP_ID": "hz", "SLUICE_JOB": "echo", "SLUICE_INSTANCE_ID": "i1",
		"SLUICE_INPUT_TOPICS": "in", "SLUICE_OUTPUT_TOPIC": "out", "SLUICE_STATE_DIR": t.TempDir(),
	}, jobSpecs())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	inst, err := sluice.New(engineOptions(cfg, newLogger(0), reg)) // not started
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpHandler(reg, inst.Ready, &stateQueries{}))
	defer srv.Close()
	addr := portOf(t, srv.Listener.Addr().String())
	if code, out, errs := healthz(nil, addr); code != 0 {
		t.Errorf("healthz: exit %d (%q %q), want 0", code, out, errs)
	}
	if code, _, errs := healthz([]string{"--ready"}, addr); code != 1 || !strings.Contains(errs, "503 not ready") {
		t.Errorf("healthz --ready before the instance runs: exit %d, %q; want 1 and the 503", code, errs)
	}
}

// End to end with a broker: `processor healthz --ready` passes once the
// instance is ready and fails once it stopped; `processor healthz` is
// dispatched from the command line with the process environment.
func TestHealthzEndToEnd(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	metrics := freeAddr(t)
	s := startServe(t, map[string]string{
		"SLUICE_BROKERS": c.ListenAddrs()[0], "SLUICE_APP_ID": "hz", "SLUICE_JOB": "echo", "SLUICE_INSTANCE_ID": "i1",
		"SLUICE_INPUT_TOPICS": "in", "SLUICE_OUTPUT_TOPIC": "out", "SLUICE_STATE_DIR": t.TempDir(),
		"SLUICE_METRICS_ADDR": metrics, "SLUICE_SESSION_TIMEOUT": "6s",
	})
	s.awaitReady(t)
	t.Setenv("SLUICE_METRICS_ADDR", metrics)
	for _, args := range [][]string{{"healthz"}, {"healthz", "--ready"}} {
		if code := run(args); code != 0 {
			t.Errorf("processor %s: exit %d, want 0", strings.Join(args, " "), code)
		}
	}
	s.stop(t)
	if code, _, errs := healthz([]string{"--ready"}, metrics); code != 1 || !strings.Contains(errs, "connection refused") {
		t.Errorf("healthz --ready after the instance stopped: exit %d, %q; want 1", code, errs)
	}
}

// processor generate serves /healthz, and /readyz once a record went out,
// so its container has a health check like the processors'.
func TestHealthzGenerator(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "numbers"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	metrics := freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan int, 1)
	go func() {
		done <- generate(ctx, map[string]string{
			"SLUICE_BROKERS": c.ListenAddrs()[0], "SLUICE_GENERATE_TOPIC": "numbers",
			"SLUICE_GENERATE_RATE": "100", "SLUICE_METRICS_ADDR": metrics,
		})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, errs := healthz([]string{"--ready"}, metrics)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("generate never turned ready: %s", errs)
		}
		select {
		case code := <-done:
			t.Fatalf("generate exited with %d", code)
		case <-time.After(50 * time.Millisecond):
		}
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("generate exited with %d when stopped", code)
	}
}
