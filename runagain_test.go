package sluice_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An instance whose Run returned runs again (an in-process restart, with
// the same registry): it rejoins, consumes what came meanwhile, and every
// input is counted once. A second Run while one runs is refused.
func TestRunAgainAfterItReturned(t *testing.T) {
	const app = "again"
	brokers, adm := inputCluster(t, 4, nil)
	half := applyKeys * applyPerKey / 2
	produceAggregateRange(t, brokers, 0, half)
	state := filepath.Join(t.TempDir(), "s")
	r := startInstance(t, aggregateOptions(brokers, app, state))
	waitUntil(t, "the first half consumed", func() bool { return consumedAll(adm, app, int64(half))(r.inst) })
	// Bounded, so that without the refusal this fails rather than hangs.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.inst.Run(ctx); err == nil || !strings.Contains(err.Error(), "while the instance's Run is running") {
		t.Fatalf("a second Run at once: %v, want it refused", err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	produceAggregateRange(t, brokers, half, applyKeys*applyPerKey)
	// The same instance again, stopped by the test's cleanup if it fails.
	ctx, cancel = context.WithCancel(context.Background())
	again := &running{inst: r.inst, done: make(chan error, 1), cancel: cancel}
	go func() { again.done <- r.inst.Run(ctx) }()
	t.Cleanup(func() { again.stop() })
	waitUntil(t, "every input consumed", func() bool { return consumedAll(adm, app, applyKeys*applyPerKey)(r.inst) })
	if err := again.stop(); err != nil {
		t.Fatal(err)
	}
	checkAggregations(t, state, app)
}
