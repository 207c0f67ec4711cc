package sluice_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/jobs"
)

// messages is a slog.Handler that keeps the messages logged, in order.
type messages struct {
	mu   *sync.Mutex
	msgs *[]string
}

func (m messages) Enabled(context.Context, slog.Level) bool { return true }
func (m messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	*m.msgs = append(*m.msgs, r.Message)
	return nil
}
func (m messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m messages) WithGroup(string) slog.Handler      { return m }

func (m messages) all() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), *m.msgs...)
}

// With Options.RestoreConcurrency 1, the tasks of an instance that lost its
// state dir restore from the changelog one at a time (each restore begins
// after the one before it has ended), and all of them do. Restarted with
// its state dir, the instance reads only short tails, which never wait.
func TestRestoreConcurrencyBoundsRestores(t *testing.T) {
	// Distinct keys, so that each task's changelog holds more than a
	// batch (changelog.DefaultBatchKeys): only such restores take turns.
	const partitions, records = 4, 4 * (changelog.DefaultBatchKeys + 2000)
	recs := make([]*kgo.Record, records)
	for i := range recs {
		recs[i] = &kgo.Record{Key: []byte("k" + strconv.Itoa(i)), Value: []byte("1")}
	}
	brokers, adm := inputCluster(t, partitions, recs)
	run := func(state string, restores int, log *slog.Logger, until func(*sluice.Instance) bool) {
		t.Helper()
		opts := testOptions(brokers, "rc", jobs.Aggregate(), state)
		opts.OutputTopic, opts.RestoreConcurrency, opts.Logger = "out", restores, log
		runUntil(t, opts, until)
	}
	quiet := slog.New(slog.DiscardHandler)
	run(filepath.Join(t.TempDir(), "first"), 0, quiet, consumedAll(adm, "rc", records))

	// A new state dir: every task restores its whole changelog partition.
	second := filepath.Join(t.TempDir(), "second")
	restore := func() (began, ended int) {
		t.Helper()
		var mu sync.Mutex
		var msgs []string
		h := messages{mu: &mu, msgs: &msgs}
		// Ready alone may come before the group assigns the tasks.
		restored := func(inst *sluice.Instance) bool {
			n := 0
			for _, m := range h.all() {
				if m == "task restored" {
					n++
				}
			}
			return n == partitions && inst.Ready()
		}
		run(second, 1, slog.New(h), restored)
		running := 0
		for _, m := range h.all() {
			switch m {
			case "restoring task":
				began++
				running++
			case "restore read its changelog; its turn ends":
				running--
			case "task restored":
				ended++
			}
			if running > 1 {
				t.Fatalf("a restore began while another ran, with RestoreConcurrency 1: %q", h.all())
			}
		}
		return began, ended
	}
	if began, ended := restore(); began != partitions || ended != partitions {
		t.Fatalf("from scratch, %d restores took a turn and %d ended, want %d each", began, ended, partitions)
	}
	if began, ended := restore(); began != 0 || ended != partitions {
		t.Fatalf("with the state dir kept, %d restores took a turn and %d ended, want 0 and %d", began, ended, partitions)
	}
}
