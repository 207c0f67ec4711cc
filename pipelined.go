package sluice

import (
	"context"
	"maps"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink"
)

// Pipelined epochs (Options.PipelinedEpochs): epoch E+1 is processed while
// E's commit waits for the broker, the non-blocking analogue of Flink's
// unaligned checkpoints.
//
// Without them the loop stops at E's barrier until E committed: the
// session's flush (every output, changelog record and marker of E
// acknowledged), then TxnOffsetCommit and EndTxn. With them, the flush runs
// on a goroutine of its own while the loop polls and processes E+1:
//
//   - E is sealed at its barrier, after its changelog and marker were
//     produced: each task keeps E's offsets, marker, changes and sink rows
//     apart (sealedEpoch), its store sets E's write-set aside under a fresh
//     one for E+1 (kstate.Store.Seal), and its clock keeps E's watermark.
//     E+1's rows for Options.Sink go into a sink transaction of their own.
//   - Once every record of E was acknowledged, the flush's goroutine runs
//     the sink's pre-commit of E's rows (prepareSink), still beside E+1's
//     processing: the sink's rules hold as they are (txsink.EpochSink),
//     since its pre-commit comes after the flush and before EndTxn either
//     way. A commit is not overlapped while earlier sink commits or
//     rollbacks are pending: the loop settles them first.
//   - E+1's outputs and dead letters are held in the loop (held), not
//     produced: E's transaction is still open, and a record produced now
//     would join it. Nothing else is produced before E+1's barrier.
//   - Once the flush returned, the loop ends E as a synchronous commit
//     does (endTxn, if the sink's pre-commit succeeded), with E's
//     offsets given to the TxnOffsetCommit in place
//     of the consumer's positions, which are E+1's by then
//     (txsink.CommitOffsetsAs). TxnOffsetCommit and EndTxn run on the loop
//     goroutine as before: franz-go's session must not poll during them.
//   - E committed: E is applied from its sealed fields, and E+1's held
//     records are produced in E+1's transaction, before anything else of
//     E+1 (run, ActApply). E failed: E+1 is dropped with it, and both
//     replay from E-1's offsets, as any abort replays the open epoch.
//
// So nothing of the protocol's order moves: E+1's records reach Kafka only
// in E+1's transaction, after E committed; a backend takes E only after E
// committed and E+1 only after E+1 did; an abort leaves every task at its
// last committed epoch. The crash table of DESIGN.md holds as it is: a
// crash during the overlap is a crash during E's commit with E+1 unsent.
//
// The loop ends the overlap early, waiting for the flush and the sink's
// pre-commit (waitPipe), before it acts on a rebalance, a rebalance
// request, a shutdown, a restored task (the task set changes only between
// checkpoints), an epoch budget reached, or when the held records reach
// maxHeldRecords; a commit that follows at once from such a wait does not
// overlap, so that the loop then finds the coordinator processing. A
// rebalance stays blocked while a commit is under way (it would abort it):
// the request it makes is served at the next iteration, after the commit.
// Timers, the TTL sweep and broadcast records are handled during an
// overlap as records are: they join the epoch being processed. A poll
// whose rebalance events make the loop wait for the commit is dropped and
// fetched again: the wait may end an epoch, or abort it and rewind the
// tasks. A commit is not overlapped (it runs as without the option)
// at-least-once (refused by Options), while an input is suspected of
// poison or a refused epoch is replayed (poison.go: their outputs go
// alone), and for the final and the revoking checkpoints, after which
// nothing is processed.

// sealedEpoch is a task's epoch sealed at its barrier while its transaction
// commits.
type sealedEpoch struct {
	next      map[string]int64  // the input offsets after it
	advanced  bool              // it consumed records
	marker    *kgo.Record       // its marker
	dirty     []kstate.Mutation // its changes as they went to the changelog
	watermark time.Time         // its marker's watermark
	// sink and sinkID are its rows for Options.Sink and their
	// transaction's name, which its marker carries (sink.go).
	sink   txsink.EpochTxn
	sinkID *txsink.TxnID
}

// seal sets the task's ending epoch aside, if it produced a marker, so that
// the task can process the next one (see above).
func (t *task) seal() error {
	if t.marker == nil {
		return nil // nothing ends: the epoch was empty
	}
	if err := t.store.Seal(); err != nil {
		return err
	}
	e := t.ending()
	e.next = maps.Clone(e.next) // the next epoch goes on from t.next
	t.sealed = &e
	if t.clock != nil {
		t.clock.seal()
	}
	t.advanced = false
	t.marker, t.dirty = nil, nil
	t.sink, t.sinkID = nil, nil // the next epoch's rows are a transaction of their own
	return nil
}

// ending is the epoch being committed: the sealed one, or else the open
// one (its fields shared with the task's).
func (t *task) ending() sealedEpoch {
	if s := t.sealed; s != nil {
		return *s
	}
	return sealedEpoch{next: t.next, advanced: t.advanced, marker: t.marker, dirty: t.dirty, watermark: t.watermark(), sink: t.sink, sinkID: t.sinkID}
}

// maxHeldRecords bounds the records held during an overlap; the loop waits
// for the commit once they reach it (franz-go's own buffer is 100,000).
const maxHeldRecords = 50_000

// pipedCommit is the commit under way while the loop processes the next
// epoch.
type pipedCommit struct {
	offsets offsets            // the committing epoch's, for its TxnOffsetCommit
	cancel  context.CancelFunc // the flush's and the sink pre-commit's context, bounded by the checkpoint timeout
	flushed chan error         // the flush's result; buffered
	// sink is the sink's pre-commit of the epoch's rows, which the
	// flush's goroutine runs once every record was acknowledged; written
	// before flushed is sent.
	sink sinkResult
}

// heldRecord is a record of the epoch after the one committing, and its
// promise.
type heldRecord struct {
	r       *kgo.Record
	promise func(*kgo.Record, error)
}

// overlaps reports whether the commit of the epoch act ends may run while
// the loop processes the next one.
func (l *loop) overlaps(act barrier.Action) bool {
	in := l.in
	if !in.cfg.PipelinedEpochs || in.cfg.Guarantee != ExactlyOnce || l.refused.Load() || l.noOverlap {
		return false
	}
	if len(l.sink.commits)+len(l.sink.aborts) > 0 {
		// The sink's pre-commit settles these first (rule 4 of
		// txsink.EpochSink; their rows' locks), on the loop.
		return false
	}
	switch act.Reason {
	case barrier.ReasonShutdown, barrier.ReasonRevoke:
		return false // nothing is processed after these
	}
	for _, t := range l.tasks {
		if len(t.poison) > 0 || t.replayUntil != nil {
			return false
		}
	}
	return true
}

// startPipe seals the ending epoch, whose TxnOffsetCommit will carry at,
// and starts its flush on a goroutine of its own; finishPipe ends the
// commit.
func (l *loop) startPipe(at offsets) error {
	for _, p := range l.taskList() {
		if err := l.tasks[p].seal(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.in.cfg.Checkpoint.Timeout)
	pc := &pipedCommit{offsets: at, cancel: cancel, flushed: make(chan error, 1)}
	cl := l.sess.Client()
	work := l.sinkWork() // the sealed epoch's rows
	go func() {
		err := cl.Flush(ctx)
		// Ordering rule (txsink.EpochSink rule 1): the sink's
		// pre-commit runs once every record of the epoch, its markers
		// included, was acknowledged, and none failed: franz-go runs
		// the promise of every buffered record before the flush
		// returns. (A record it fails before buffering it, one without
		// a topic, which the engine never makes, may report later;
		// checkFlushed would then abort the epoch, rolling back what
		// was prepared, before any EndTxn.) Nothing is pending to
		// settle first (overlaps), and the held records of the next
		// epoch are not produced, so none of theirs can fail.
		if err == nil && l.produceErr.Load() == nil {
			pc.sink = prepareSink(ctx, work)
		}
		pc.flushed <- err
		l.in.wakeLoop() // the poll in progress ends, so the commit goes on
	}()
	l.pipe = pc
	l.holding = true
	return nil
}

// finishPipe ends the commit startPipe began, once its flush returned: at
// once if wait is set, else only if the flush is done already. The
// coordinator's actions run from there (the apply, the held records, the
// next barrier if one waits).
func (l *loop) finishPipe(wait bool) error {
	pc, err := l.takePipe(wait)
	if pc == nil {
		return nil
	}
	act, ok := l.checkFlushed(err)
	if ok {
		// A deadline of its own: the flush's may be mostly spent by
		// the processing since (found by review).
		ctx, cancel := context.WithTimeout(context.Background(), l.in.cfg.Checkpoint.Timeout)
		// The sink's pre-commit of the sealed epoch's rows ran after
		// the flush; EndTxn only if it succeeded.
		if act, ok = l.sinkPrepared(pc.sink); ok {
			act = l.endTxn(txsink.CommitOffsetsAs(ctx, pc.offsets), pc.offsets)
		}
		cancel()
	}
	return l.run(act)
}

// takePipe ends the overlap once the flush under way returned, and the
// sink's pre-commit after it (at once if wait is set, else only if they
// are done already), and returns the commit with the flush's result; nil
// if there is none, or it is not done. The session may end the
// transaction only after it.
func (l *loop) takePipe(wait bool) (*pipedCommit, error) {
	pc := l.pipe
	if pc == nil {
		return nil, nil
	}
	var err error
	if wait {
		err = <-pc.flushed
	} else {
		select {
		case err = <-pc.flushed:
		default:
			return nil, nil
		}
	}
	l.flushCounts() // the records processed during the overlap count as such
	l.pipe, l.holding = nil, false
	pc.cancel()
	// What the flush's goroutine tried to prepare, an abort (or the next
	// restore) rolls back.
	l.sink.prepared = append(l.sink.prepared, pc.sink.tried...)
	return pc, err
}

// waitPipe lets the commit under way finish (finishPipe) before the loop
// acts on something the overlap must not see; a commit that follows from
// it (the next epoch was due already) does not overlap, so that the loop
// finds the coordinator processing, or done, when it returns.
func (l *loop) waitPipe() error {
	if l.pipe == nil {
		return nil
	}
	l.noOverlap = true
	defer func() { l.noOverlap = false }()
	return l.finishPipe(true)
}

// send produces r in the open epoch, or, during an overlap, holds it for
// releaseHeld: it belongs to the epoch after the one committing. Tasks
// processed in parallel may call it at once.
func (l *loop) send(r *kgo.Record, promise func(*kgo.Record, error)) {
	if !l.holding {
		l.sess.Produce(context.Background(), r, promise)
		return
	}
	l.heldMu.Lock()
	l.held = append(l.held, heldRecord{r, promise})
	l.heldMu.Unlock()
}

// heldLen is how many records are held.
func (l *loop) heldLen() int {
	l.heldMu.Lock()
	defer l.heldMu.Unlock()
	return len(l.held)
}

// releaseHeld produces the held records in their epoch's transaction, which
// it opens: the epoch before them committed.
// It opens it too when nothing is held but the epoch has work (records
// processed, state changed), so that an open transaction goes with work
// as without the overlap (release relies on it).
func (l *loop) releaseHeld() error {
	if len(l.held) == 0 && !l.epochHasWork() {
		return nil
	}
	if err := l.begin(); err != nil {
		l.dropHeld()
		return err
	}
	for _, h := range l.held {
		l.sess.Produce(context.Background(), h.r, h.promise)
	}
	l.held = nil
	return nil
}

// epochHasWork reports whether a task processed records or changed state
// in the open epoch.
func (l *loop) epochHasWork() bool {
	for _, t := range l.tasks {
		if t.advanced || t.store.DirtyLen() > 0 {
			return true
		}
	}
	return false
}

// dropHeld drops the held records: their epoch aborts.
func (l *loop) dropHeld() {
	for _, h := range l.held {
		recycle(h.r)
	}
	l.held = nil
}
