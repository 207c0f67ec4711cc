package sluice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink"
)

// WriteRow sends a row to the instance's sink (Options.Sink), one value per
// column of its table. It does no I/O: the row joins the record's outputs,
// is dropped if the record fails, and is written with the task's other rows
// of the epoch when the epoch commits (docs/sinks.md). A row the sink could
// never write (wrong arity or type, a NULL key, text that is not valid
// UTF-8 or holds a NUL) fails the record, which goes to the dead-letter
// topic, and so does WriteRow without a sink. The values must not change
// after the call.
func WriteRow(ctx Context, row ...any) error {
	c, _, ok := engineContext(ctx)
	if !ok {
		return errors.New("sluice: WriteRow needs the Context the engine passed to the job")
	}
	var err error
	if sink := c.in.cfg.Sink; sink == nil {
		err = errors.New("sluice: WriteRow: the instance has no sink (Options.Sink)")
	} else {
		err = sink.Check(row)
	}
	if err != nil {
		c.t.store.Fail(err)
		return err
	}
	c.rows = append(c.rows, row)
	return nil
}

// sinkFinal returns err if it stops the instance (rather than failing
// epochs forever, or losing rows), nil otherwise. A conflict at pre-commit
// is first taken for a zombie's (see handleConflict).
func sinkFinal(err error) error {
	if errors.Is(err, txsink.ErrSinkRefused) || errors.Is(err, txsink.ErrSinkConflict) || errors.Is(err, txsink.ErrSinkSetup) {
		return err
	}
	return nil
}

// sinkMetrics are the sink's series, registered only with a sink.
type sinkMetrics struct {
	txns      *prometheus.CounterVec
	preCommit prometheus.Histogram
	pending   atomic.Int64 // commits and rollbacks waiting to be tried again
}

// newSinkMetrics makes the sink's metrics and returns them with the
// collectors to register (register, in New).
func newSinkMetrics() (*sinkMetrics, []prometheus.Collector) {
	m := &sinkMetrics{
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_sink_transactions_total",
			Help: "Sink transactions of tasks' epochs by step: prepared, committed, rolled_back, or failed (a pre-commit that did not prepare)."}, []string{"result"}),
		preCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_sink_precommit_seconds",
			Help: "Time to write and prepare every task's rows of an epoch in the sink.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
	}
	for _, r := range []string{"prepared", "committed", "rolled_back", "failed"} {
		m.txns.WithLabelValues(r)
	}
	cs := []prometheus.Collector{m.txns, m.preCommit, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_sink_pending_transactions",
		Help: "Sink transactions whose commit or rollback failed and waits to be tried again (the database unreachable)."},
		func() float64 { return float64(m.pending.Load()) })}
	return m, cs
}

// sinkState is the loop's side of the sink's epochs.
type sinkState struct {
	// prepared are the epoch's transactions PreCommit was called for
	// (whether it succeeded or not: a lost answer may still have
	// prepared one); an abort rolls them back.
	prepared []txsink.TxnID
	// commits are transactions Kafka committed whose COMMIT PREPARED
	// failed; aborts those Kafka aborted whose rollback failed. Both are
	// tried again before the next EndTxn (rule 4 of txsink.EpochSink) and
	// when idle.
	commits, aborts []txsink.TxnID
	triedAt         time.Time
}

// sinkRows moves the rows of a record or timer that succeeded into the
// task's epoch.
func (t *task) sinkRows(in *Instance, rows [][]any) {
	if len(rows) == 0 {
		return
	}
	if t.sink == nil {
		t.sink = in.cfg.Sink.Begin(t.p)
	}
	for _, r := range rows {
		t.sink.Write(r)
	}
}

// sinkTxn names the task's sink transaction of the epoch for its marker:
// "" when the epoch wrote no rows. Each attempt at an epoch gets a nonce of
// its own: an aborted attempt may still be prepared (its rollback failed)
// when the epoch is tried again.
func (t *task) sinkTxn(in *Instance) string {
	if t.sink == nil || t.sink.Len() == 0 {
		t.sinkID = nil
		return ""
	}
	if t.sinkID == nil || t.sinkID.Epoch != t.epoch+1 {
		t.sinkID = &txsink.TxnID{App: in.cfg.AppID, Task: t.p, Epoch: t.epoch + 1, Nonce: strconv.FormatUint(rand.Uint64(), 36)}
	}
	return t.sinkID.String()
}

// sinkPreCommit writes and prepares every task's rows of the epoch, tasks
// in parallel, after the transactions Kafka already decided are settled.
//
// Ordering rule (txsink.EpochSink rules 1, 2 and 4): called after every
// Kafka record of the epoch, the markers naming these transactions
// included, is acknowledged, and before EndTxn; EndTxn is sent only if it
// succeeded, and never while an earlier epoch's commit is pending. With
// pipelined epochs the pre-commit runs on the flush's goroutine instead
// (startPipe), under the same rules.
func (l *loop) sinkPreCommit(ctx context.Context) (barrier.Action, bool) {
	if l.in.cfg.Sink == nil {
		return barrier.Action{}, true
	}
	if err := l.sinkSettle(ctx); err != nil {
		return l.sinkFailed(fmt.Errorf("settle earlier sink transactions: %w", err)), false
	}
	res := prepareSink(ctx, l.sinkWork())
	l.sink.prepared = append(l.sink.prepared, res.tried...)
	return l.sinkPrepared(res)
}

// taskSinkTxn is a task's sink transaction of the epoch committing: its
// rows and the name its marker gave them.
type taskSinkTxn struct {
	id  txsink.TxnID
	txn txsink.EpochTxn
}

// sinkResult is what the pre-commit of an epoch's sink transactions did.
type sinkResult struct {
	// tried are the transactions PreCommit was called for, whether it
	// succeeded or not (see sinkState.prepared).
	tried  []txsink.TxnID
	failed []sinkFailure
	took   time.Duration
}

// sinkFailure is a transaction whose PreCommit failed, and why.
type sinkFailure struct {
	id  txsink.TxnID
	err error
}

// sinkWork lists the tasks' sink transactions of the epoch committing: the
// sealed one during an overlap (pipelined.go), whose rows the next epoch's
// do not join.
func (l *loop) sinkWork() []taskSinkTxn {
	if l.in.cfg.Sink == nil {
		return nil
	}
	var work []taskSinkTxn
	for _, p := range l.taskList() {
		e := l.tasks[p].ending()
		if e.marker == nil || e.sinkID == nil {
			continue
		}
		work = append(work, taskSinkTxn{*e.sinkID, e.sink})
	}
	return work
}

// prepareSink runs the PreCommit of each transaction of work, in parallel.
// It touches nothing of the loop: during an overlap it runs on the
// flush's goroutine while the loop processes the next epoch.
func prepareSink(ctx context.Context, work []taskSinkTxn) sinkResult {
	var res sinkResult
	if len(work) == 0 {
		return res
	}
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, w := range work {
		res.tried = append(res.tried, w.id)
		wg.Go(func() {
			if err := w.txn.PreCommit(ctx, w.id); err != nil {
				mu.Lock()
				res.failed = append(res.failed, sinkFailure{w.id, err})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.took = time.Since(start)
	return res
}

// sinkPrepared takes in the pre-commit's result: EndTxn may follow if
// every transaction was prepared; otherwise the commit failed, and the
// returned action says what to do next. The caller added res.tried to
// l.sink.prepared, so that an abort rolls them back.
func (l *loop) sinkPrepared(res sinkResult) (barrier.Action, bool) {
	if l.in.cfg.Sink == nil {
		return barrier.Action{}, true
	}
	var errs []error
	for _, f := range res.failed {
		if errors.Is(f.err, txsink.ErrSinkConflict) {
			l.handleConflict(f.id, f.err)
		}
		errs = append(errs, f.err)
	}
	sm := l.in.sinkM
	sm.txns.WithLabelValues("failed").Add(float64(len(errs)))
	sm.txns.WithLabelValues("prepared").Add(float64(len(res.tried) - len(errs)))
	if err := errors.Join(errs...); err != nil {
		return l.sinkFailed(err), false
	}
	sm.preCommit.Observe(res.took.Seconds())
	for _, id := range res.tried {
		delete(l.in.sinkConflicts, id.Task)
	}
	return barrier.Action{}, true
}

// handleConflict handles an epoch the sink holds already. Most often this
// instance is a zombie: paused past its session, it lost the task, and the
// new owner committed the epoch; its Kafka commit would be fenced anyway.
// So the first time the session is rebuilt (the instance rejoins and
// restores the task's true position); the same task and epoch conflicting
// again after that restore is real (another app with this id writing to
// the same database, an audit row added by hand) and stops the instance.
func (l *loop) handleConflict(id txsink.TxnID, err error) {
	if l.in.sinkConflicts == nil {
		l.in.sinkConflicts = map[int32]uint64{}
	}
	if e, ok := l.in.sinkConflicts[id.Task]; ok && e == id.Epoch {
		l.fatal = fmt.Errorf("sluice: sink: the conflict persists after the task was restored: %w", err)
		return
	}
	l.in.sinkConflicts[id.Task] = id.Epoch
	l.sessionBroken(err)
}

// sinkFailed fails the epoch's commit; an error that retrying cannot fix
// stops the instance once the epoch is aborted.
func (l *loop) sinkFailed(err error) barrier.Action {
	l.in.log.Warn("sink pre-commit failed; the epoch aborts", "err", err)
	if errors.Is(err, txsink.ErrSinkRefused) {
		l.fatal = fmt.Errorf("sluice: sink: %w", err)
	}
	return l.coord.CommitFailed(err, time.Now())
}

// sinkCommitted makes the epoch's prepared transactions visible once Kafka
// committed it (rule 3); one that fails stays pending, tried again before
// the next EndTxn. An error is final: a committed epoch's rows are gone.
func (l *loop) sinkCommitted() error {
	ids := l.sink.prepared
	l.sink.prepared = nil
	l.sink.commits = append(l.sink.commits, ids...)
	if len(l.sink.commits) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.in.cfg.Checkpoint.Timeout)
	defer cancel()
	err := l.sinkSettle(ctx)
	if final := sinkFinal(err); final != nil {
		return final
	}
	if err != nil {
		l.in.log.Warn("sink commit failed; it stays pending and is tried again before the next epoch commits", "err", err, "pending", len(l.sink.commits))
	}
	return nil
}

// sinkUnknown forgets the epoch's prepared transactions when EndTxn's
// outcome is unknown: neither commit nor rollback is safe, and the restores
// of the rebuilt session decide (rule 3).
func (l *loop) sinkUnknown() { l.sink.prepared = nil }

// sinkAborted rolls back the epoch's prepared transactions once Kafka
// aborted it; a rollback that fails is tried again later (a stray prepared
// transaction holds its rows' locks).
func (l *loop) sinkAborted() {
	if len(l.sink.prepared) == 0 {
		return
	}
	l.sink.aborts = append(l.sink.aborts, l.sink.prepared...)
	l.sink.prepared = nil
	ctx, cancel := context.WithTimeout(context.Background(), l.in.cfg.Checkpoint.Timeout)
	defer cancel()
	if err := l.sinkSettle(ctx); err != nil {
		l.in.log.Warn("sink rollback failed; it is tried again", "err", err)
	}
}

// sinkSettle commits the pending commits and rolls back the pending
// aborts, in parallel; those that fail stay pending.
func (l *loop) sinkSettle(ctx context.Context) error {
	if len(l.sink.commits)+len(l.sink.aborts) == 0 {
		if sm := l.in.sinkM; sm != nil {
			sm.pending.Store(0) // a new session starts with nothing pending
		}
		return nil
	}
	l.sink.triedAt = time.Now()
	sink := l.in.cfg.Sink
	var mu sync.Mutex
	var errs []error
	var commits, aborts []txsink.TxnID
	var wg sync.WaitGroup
	run := func(id txsink.TxnID, op func(context.Context, txsink.TxnID) error, keep *[]txsink.TxnID) {
		wg.Go(func() {
			if err := op(ctx, id); err != nil {
				mu.Lock()
				errs = append(errs, err)
				*keep = append(*keep, id)
				mu.Unlock()
			}
		})
	}
	for _, id := range l.sink.commits {
		run(id, sink.Commit, &commits)
	}
	for _, id := range l.sink.aborts {
		run(id, sink.Abort, &aborts)
	}
	wg.Wait()
	sm := l.in.sinkM
	sm.txns.WithLabelValues("committed").Add(float64(len(l.sink.commits) - len(commits)))
	sm.txns.WithLabelValues("rolled_back").Add(float64(len(l.sink.aborts) - len(aborts)))
	l.sink.commits, l.sink.aborts = commits, aborts
	sm.pending.Store(int64(len(commits) + len(aborts)))
	return errors.Join(errs...)
}

// sinkIdle tries pending commits and rollbacks again, at most once a
// second, while the loop has nothing else to do with them.
func (l *loop) sinkIdle() error {
	if len(l.sink.commits)+len(l.sink.aborts) == 0 || time.Since(l.sink.triedAt) < time.Second {
		return nil
	}
	ctx, cancel := context.WithTimeout(l.ctx, l.in.cfg.Checkpoint.Timeout)
	defer cancel()
	err := l.sinkSettle(ctx)
	if final := sinkFinal(err); final != nil {
		return fmt.Errorf("sluice: sink: %w", final)
	}
	if err != nil {
		l.in.log.Warn("sink transactions still pending", "err", err, "commits", len(l.sink.commits), "rollbacks", len(l.sink.aborts))
	}
	return nil
}

// sinkShutdown makes a last attempt at what is pending; whatever is left
// is settled by the next restore of each task.
func (l *loop) sinkShutdown() {
	if len(l.sink.commits)+len(l.sink.aborts) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.sinkSettle(ctx); err != nil {
		l.in.log.Warn("sink transactions left pending at shutdown; the next restore of their tasks settles them", "err", err)
	}
}

// sinkClaim starts a task's restore on the sink's side (rule 5): before
// anything of the changelog is read. Like sinkRecover it is bounded by the
// checkpoint timeout, as the sink's calls in a checkpoint are: a sink that
// does not answer fails the restore, which is logged and tried again,
// instead of leaving the task restoring without a word.
func (in *Instance) sinkClaim(ctx context.Context, p int32) (txsink.Claim, error) {
	if in.cfg.Sink == nil {
		return txsink.Claim{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, in.cfg.Checkpoint.Timeout)
	defer cancel()
	c, err := in.cfg.Sink.Claim(ctx, p)
	if err != nil {
		return c, fmt.Errorf("sink: task %d: %w", p, err)
	}
	return c, nil
}

// sinkRecover ends a task's restore: the last marker's sink transaction is
// committed, other strays prepared before the claim are rolled back. The
// task runs only once this succeeded (rule 6); until then it stays
// restoring and the restore is tried again every second.
func (in *Instance) sinkRecover(ctx context.Context, c txsink.Claim, meta kstate.Meta) error {
	if in.cfg.Sink == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, in.cfg.Checkpoint.Timeout)
	defer cancel()
	if err := in.cfg.Sink.Recover(ctx, c, meta.SinkTxn); err != nil {
		return fmt.Errorf("sink: recover task %d at epoch %d: %w", c.Task, meta.Epoch, err)
	}
	return nil
}
