package main

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"
)

// stopBound is how long an instance that must stop may take. It stops in
// well under a second; the bound only tells a stop from a retry loop on a
// loaded machine.
const stopBound = 60 * time.Second

// served is serve running in this process, as `processor run` runs it.
type served struct {
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
	log     *lockedBuffer
	metrics string
}

func startServe(t *testing.T, environ map[string]string) *served {
	t.Helper()
	cfg, err := loadConfig(environ, jobSpecs())
	if err == nil {
		err = cfg.validateRun()
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{cancel: cancel, done: make(chan struct{}), log: &lockedBuffer{}, metrics: cfg.MetricsAddr}
	log := slog.New(slog.NewJSONHandler(s.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	go func() {
		defer close(s.done)
		s.err = serve(ctx, log, cfg)
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
		if t.Failed() {
			t.Logf("log of %s (serve returned %v):\n%s", cfg.AppID, s.err, s.log.String())
		}
	})
	return s
}

// wait returns serve's error once it stopped by itself.
func (s *served) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(stopBound):
		t.Fatalf("still running %v after it should have stopped (a retry loop?)", stopBound)
		return nil
	}
}

// stop ends a running serve as SIGTERM does; it must return nil.
func (s *served) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatalf("stopped with %v", err)
	}
}

// awaitReady polls /readyz until it answers 200, or serve stops.
func (s *served) awaitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + s.metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-s.done:
			t.Fatalf("stopped before it was ready: %v", s.err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready after 30s")
		}
	}
}
