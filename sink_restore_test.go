package sluice_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/txsink"
)

// stallingClaim is a sink whose first Claim does not answer until its
// context ends, as a database that stopped answering would.
type stallingClaim struct {
	txsink.EpochSink
	stalled atomic.Bool
}

func (s *stallingClaim) Claim(ctx context.Context, task int32) (txsink.Claim, error) {
	if s.stalled.CompareAndSwap(false, true) {
		<-ctx.Done()
		return txsink.Claim{}, ctx.Err()
	}
	return s.EpochSink.Claim(ctx, task)
}

// A restore's calls of the sink are bounded by the checkpoint timeout, as
// its other calls are: a sink that does not answer a task's claim fails
// that restore, which is logged and tried again, and every input then
// reaches the state and the table once. Unbounded, the task stayed
// restoring without a word for as long as the instance ran.
func TestSinkThatDoesNotAnswerARestoreIsRetried(t *testing.T) {
	pg := pgtest.Start(t)
	const app = "claim-stall"
	brokers, adm := inputCluster(t, 4, nil)
	produceAggregateInput(t, brokers)
	state := filepath.Join(t.TempDir(), "s")
	opts := aggregateOptions(brokers, app, state)
	opts.Checkpoint.Timeout = 5 * time.Second // the stalled claim's bound
	url := pg.Database(t, "claimstall")
	withAggregateSink(t, &opts, url)
	stall := &stallingClaim{EpochSink: opts.Sink}
	opts.Sink = stall
	var mu sync.Mutex
	var msgs []string
	logged := messages{mu: &mu, msgs: &msgs}
	opts.Logger = slog.New(logged)

	r := startInstance(t, opts)
	waitUntil(t, "the failed restore logged", func() bool { return slices.Contains(logged.all(), "restore failed; retrying") })
	waitUntil(t, "every input consumed", func() bool { return consumedAll(adm, app, applyKeys*applyPerKey)(r.inst) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if !stall.stalled.Load() {
		t.Fatal("no claim was made")
	}
	checkAggregations(t, state, app)
	checkAggregateTable(t, url, aggregateInputs(applyKeys*applyPerKey))
}
