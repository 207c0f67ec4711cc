package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// recorder is a slog.Handler that keeps the messages logged, in order.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// eventually polls cond until it holds or 30s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The service and the instance in one process: clicks posted over HTTP are
// counted exactly once, /metrics serves both sides' series from one
// registry, /readyz follows the instance, and shutdown goes readiness,
// HTTP, instance, in that order.
func TestService(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "clicks", "clicks-per-user"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg, err := parseFlags([]string{"-brokers", c.ListenAddrs()[0], "-instance", "test-1",
		"-state-dir", t.TempDir(), "-drain-delay", "5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	logs := &recorder{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, ln, slog.New(logs)) }()

	eventually(t, "/readyz to answer 200", func() bool { code, _ := get(base + "/readyz"); return code == http.StatusOK })
	for _, body := range []string{`{"user":"ann","url":"/"}`, `{"user":"bob","url":"/"}`, `{"user":"ann","url":"/pricing"}`, `{"url":"/"}`} {
		resp, err := http.Post(base+"/clicks", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusAccepted
		if !strings.Contains(body, "user") {
			want = http.StatusBadRequest
		}
		if resp.StatusCode != want {
			t.Fatalf("POST %s: %d, want %d", body, resp.StatusCode, want)
		}
	}

	reader, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("clicks-per-user"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var counts []Count
	for len(counts) < 3 && rctx.Err() == nil {
		reader.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
			var n Count
			if err := json.Unmarshal(r.Value, &n); err != nil {
				t.Fatal(err)
			}
			counts = append(counts, n)
		})
	}
	if want := []Count{{"ann", 1}, {"bob", 1}, {"ann", 2}}; !slices.Equal(counts, want) {
		t.Fatalf("counts %v, want %v", counts, want)
	}

	// The committed counts, read from the instance's state.
	eventually(t, "GET /clicks/ann to answer 2", func() bool {
		code, body := get(base + "/clicks/ann")
		return code == http.StatusOK && strings.TrimSpace(body) == `{"user":"ann","clicks":2}`
	})
	if code, body := get(base + "/clicks/bob"); code != http.StatusOK || strings.TrimSpace(body) != `{"user":"bob","clicks":1}` {
		t.Errorf("GET /clicks/bob: %d %s", code, body)
	}
	if code, body := get(base + "/clicks/cy"); code != http.StatusOK || strings.TrimSpace(body) != `{"user":"cy","clicks":0}` {
		t.Errorf("GET /clicks/cy: %d %s", code, body)
	}

	_, metrics := get(base + "/metrics")
	for _, series := range []string{
		`http_requests_total{code="202",handler="clicks"} 3`,
		`http_requests_total{code="400",handler="clicks"} 1`,
		`sluice_ready 1`,
		`sluice_records_in_total{task="0"} 3`,
		`go_goroutines `,
	} {
		if !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}

	stop()
	// While draining, the server still answers, but not ready.
	eventually(t, "/readyz to answer 503", func() bool {
		code, body := get(base + "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "shutting down")
	})
	if code, _ := get(base + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while draining: %d", code)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of its context ending")
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("the listener still accepts connections after run returned")
	}
	var order []string
	for _, m := range logs.messages() {
		if strings.HasPrefix(m, "shutdown:") || m == "left the group" {
			order = append(order, m)
		}
	}
	want := []string{"shutdown: not ready", "shutdown: http stopped", "left the group", "shutdown: instance stopped"}
	if !slices.Equal(order, want) {
		t.Errorf("shutdown steps %q, want %q", order, want)
	}
}

func TestFlags(t *testing.T) {
	if _, err := parseFlags([]string{"-shutdown-timeout", "0s"}, io.Discard); err == nil {
		t.Error("-shutdown-timeout 0s accepted")
	}
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newService(c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("the default command line: %v", err)
	}
	s.producer.Close()
}
