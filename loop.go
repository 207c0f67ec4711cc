package sluice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink"
)

// errAborted is what a commit refused by the session reports to the
// coordinator: a rebalance or a lost partition since the epoch began.
var errAborted = errors.New("transaction aborted: partitions were revoked or lost during the epoch")

// loop is one session's state, owned by the goroutine running runSession.
type loop struct {
	in        *Instance
	ctx       context.Context // cancelled on shutdown
	sess      txsink.Session
	coord     *barrier.Coordinator
	tasks     map[int32]*task
	restoring map[int32]*restoreJob
	// owned is, per partition number, the input topics whose partition the
	// group gave this member (copartition.go).
	owned map[int32]map[string]bool
	// inTxn: the epoch's transaction is open. Tasks processed in
	// parallel (parallel.go) open it through begin, under txnMu.
	inTxn atomic.Bool
	txnMu sync.Mutex
	sink  sinkState // the outside sink's transactions (sink.go)
	// bc reads the broadcast topic; bcRestart: the tasks' positions may
	// have moved back, so it must start again from them (broadcast.go).
	bc        *broadcastReader
	bcRestart bool
	// budgetFull: a task's write-set reached the epoch budget
	// (Options.EpochMaxKeys, EpochMaxBytes) in the last poll's records.
	budgetFull atomic.Bool
	sweptAt    time.Time    // last sweep of released tasks' state files
	purgedAt   time.Time    // last purge of consumed repartition records
	purged     kadm.Offsets // what it deleted below, by partition
	// refused: the epoch's commit fails because of a poison input (a
	// suspect confirmed, or a permanent produce failure), so its abort
	// bounds the replay (task.replayUntil).
	refused atomic.Bool
	ckptAt  time.Time // when the checkpoint in flight placed its barrier
	// behind is the committed epoch whose backend writes run while the
	// loop goes on (applyTasks), nil when none does; applySem bounds the
	// writes running at once.
	behind   *epochBehind
	applySem chan struct{}
	// pipe is the commit that runs while the loop processes the next
	// epoch (pipelined.go), nil when none does; holding says the loop
	// holds that epoch's records (held, under heldMu: parallel tasks add
	// to it) until the commit ends. holding is written only while no task
	// is processed.
	pipe    *pipedCommit
	holding bool
	heldMu  sync.Mutex
	held    []heldRecord
	// noOverlap: a commit must not overlap the next epoch now (waitPipe).
	noOverlap bool
	// processing: a poll's records are being processed (eachTask), when
	// the coordinator must not run (see run).
	processing atomic.Bool
	// unavailable: the last Job.Prefetch could not reach its service, so
	// the instance is not ready and batches wait unavailableFor between
	// attempts (see prefetch).
	unavailable    bool
	unavailableFor time.Duration
	// assigned: the session received its first assignment. Between
	// joining the group and that, the instance is a member with nothing
	// to restore, and not ready: it does not know its tasks yet.
	assigned bool
	// fetchErrs are the polls' errors logged lately (fetcherr.go).
	fetchErrs map[fetchErrorKey]*fetchErrorSeen

	// produceErr is the epoch's first failed produce (set from franz-go's
	// promise goroutine); brokenErr says the session must be rebuilt once
	// the abort is done; fatal is a failure only a restart can handle.
	produceErr atomic.Pointer[error]
	failed     failures // permanent failures of outputs and dead letters
	// outPromise and plainPromise are the promises of produceFor and
	// produce, made once (a method value per produce would allocate).
	outPromise, plainPromise func(*kgo.Record, error)
	// freed are slots whose records' promises ran, waiting to go to the
	// free list together (recycled); promises only. slots is that list:
	// outSlots, unless a test gives its own.
	freed     []*outSlot
	slots     *slotList
	brokenErr error
	fatal     error

	// timersDeferred: a timer's handler was cut short by the shutdown
	// (fireOne), so no more timers fire in this session. Atomic: tasks
	// processed in parallel fire their event-time timers on workers.
	timersDeferred atomic.Bool
	// betweenPolls: fireTimers is firing, after the poll's records: a
	// timer left for the next start has no record of this session after
	// it (fireOne).
	betweenPolls bool
}

type restoreJob struct {
	cancel context.CancelFunc
	result chan restoreResult // exactly one result is sent
}

type restoreResult struct {
	p       int32
	be      kstate.Backend
	meta    kstate.Meta
	orphans [][]byte // changelog keys after the last marker: see task.orphans
	err     error
}

func (in *Instance) runSession(ctx context.Context) (err error) {
	if in.cfg.Guarantee == ExactlyOnce {
		// Fence our predecessor (a killed process with the same
		// instance id) before anything else: its dangling transaction
		// is aborted now, so the restores below need not wait out the
		// transaction timeout for the changelog's last stable offset.
		fctx, cancel := context.WithTimeout(ctx, in.cfg.TransactionTimeout)
		err := txsink.Fence(fctx, in.admCl, in.cfg.transactionalID(), in.cfg.TransactionTimeout)
		cancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, kerr.InvalidTransactionTimeout):
			// Final: the broker refuses the timeout itself (the start-up
			// check is skipped without DESCRIBE_CONFIGS on the cluster).
			return fmt.Errorf("sluice: SLUICE_TRANSACTION_TIMEOUT=%s is refused by the broker (above its transaction.max.timeout.ms): %w", in.cfg.TransactionTimeout, err)
		default:
			return fmt.Errorf("%w: %w", errSessionBroken, err)
		}
	}
	sess, err := in.newSession()
	if err != nil {
		return fmt.Errorf("%w: %w", errSessionBroken, err)
	}
	// Warm-up replicas that caught up ask the group to rebalance with it.
	in.standbys.session(sess.Client())
	defer in.standbys.session(nil)
	l := &loop{
		in:        in,
		ctx:       ctx,
		sess:      sess,
		coord:     barrier.New(in.cfg.Checkpoint, time.Now(), 1),
		tasks:     map[int32]*task{},
		restoring: map[int32]*restoreJob{},
		owned:     map[int32]map[string]bool{},
	}
	l.outPromise, l.plainPromise = l.outPromised, l.plainPromised
	in.rebalanceWanted.Store(false)
	defer func() {
		// A write of the last epoch that failed leaves its backend
		// behind the changelog: a session rebuilt over it would carry
		// on, so the failure ends Run instead, as it does on the loop.
		if cerr := l.close(); cerr != nil && errors.Is(err, errSessionBroken) {
			err = cerr
		}
	}()
	for {
		if ctx.Err() != nil {
			return l.shutdown()
		}
		if err := l.iterate(); err != nil {
			return err
		}
	}
}

func (l *loop) iterate() error {
	in := l.in
	if in.killed.Load() {
		return errKilled
	}
	if _, wall := in.clock.(wallClock); !wall {
		in.queries.now.Store(in.clock.Now().UnixMilli()) // for queries' TTLs (queryNow)
	}
	if err := l.settleOrStop(false); err != nil {
		return err
	}
	defer l.flushCounts() // also when the poll's processing failed
	if err := l.finishPipe(l.heldLen() >= maxHeldRecords); err != nil {
		return err
	}
	if err := l.installRestored(); err != nil {
		return err
	}
	l.answerProbes()
	in.setReady(l.assigned && len(l.restoring) == 0 && l.joined() && !l.unavailable)
	l.sweepStateFiles()
	l.purge()
	if err := l.sinkIdle(); err != nil {
		return err
	}

	pctx, cancel := context.WithTimeout(l.ctx, l.pollWait())
	in.wakeMu.Lock()
	in.wake = cancel
	in.wakeMu.Unlock()
	fs := l.sess.PollRecords(pctx, l.pollRecords())
	cancel()
	if err := in.pollDenied(l.ctx, fs); err != nil {
		return err
	}
	if errors.Is(fs.Err0(), kgo.ErrClientClosed) {
		return fmt.Errorf("%w: client closed", errSessionBroken)
	}
	if err := in.duplicateInGroup(fs, l.joined()); err != nil {
		return err
	}
	l.logFetchErrors(fs)

	// Rebalance callbacks ran inside the poll.
	fs, err := l.handleEvents(in.takeEvents(), fs)
	if err != nil {
		return err
	}
	if err := l.process(fs); err != nil {
		return err
	}
	if err := l.applyBroadcast(); err != nil {
		return err
	}
	if err := l.fireTimers(); err != nil {
		return err
	}
	// A rebalance waits for us: commit what we have so the partitions
	// leave with their work done instead of aborted. The commit lets the
	// rebalance proceed alongside (see yieldToRebalance): the group's
	// heartbeat, which the commit needs, only resumes once it does. A
	// commit under way ends first, and none overlaps the next epoch now:
	// the rebalance, let through below, would abort it (found by review).
	wanted := in.rebalanceWanted.Swap(false)
	if wanted {
		if err := l.waitPipe(); err != nil {
			return err
		}
		l.noOverlap = true
	}
	act := l.coord.Tick(time.Now())
	if wanted && act.Kind == barrier.ActNone {
		act = l.coord.RequestRevoke(time.Now())
	}
	err = l.run(act)
	l.noOverlap = false
	if err != nil {
		return err
	}
	if l.pipe == nil {
		// While a commit is under way a rebalance stays blocked: it
		// would abort the commit. Held back, it sets rebalanceWanted,
		// which the next iteration serves as above.
		l.sess.AllowRebalance()
	}
	return nil
}

// handleEvents acts on the rebalance callbacks of the last poll, before
// the records it returned are touched, and after the commit under way, if
// any (its End aborts it if partitions went). It returns the records still
// to process: none if the consumer was rewound, for they come again.
func (l *loop) handleEvents(events []event, fs kgo.Fetches) (kgo.Fetches, error) {
	if len(events) > 0 && l.pipe != nil {
		// The wait may end an epoch (the next was due already), or
		// abort it and rewind the tasks: the poll's records come again
		// after it, so that the barrier finds the consumer where the
		// tasks stopped (found by review).
		l.sess.Client().SetOffsets(firstOffsets(fs))
		fs = nil
		if err := l.waitPipe(); err != nil {
			return nil, err
		}
	}
	for _, ev := range events {
		l.noteOwned(ev)
		// Only tasks that run or restore are released: a partition of a
		// task that never started (another input's partition was still
		// elsewhere) takes no epoch down with it. An assignment of a task
		// we still hold means it missed its revoke; its partition is
		// paused again, so drop it and restore it anew.
		gone := slices.DeleteFunc(slices.Clone(ev.tasks), func(p int32) bool {
			return l.tasks[p] == nil && l.restoring[p] == nil
		})
		if len(gone) > 0 {
			if err := l.release(ev.kind, gone); err != nil {
				return nil, err
			}
			// The release's abort rewound the consumer (the session to
			// the committed offsets, or where consuming began in a
			// partition without one; each task to its own): these
			// records come again.
			fs = nil
		}
		if ev.kind == "assigned" {
			l.assigned = true
			for _, p := range ev.tasks {
				if l.ownsTask(p) {
					l.startRestore(p)
				}
			}
		}
	}
	return fs, nil
}

// firstOffsets is where each partition of fs starts: where its records are
// fetched again from.
func firstOffsets(fs kgo.Fetches) offsets {
	at := offsets{}
	fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
		if _, ok := at[ftp.Topic][ftp.Partition]; !ok && len(ftp.Records) > 0 {
			at.set(ftp.Topic, ftp.Partition, ftp.Records[0].Offset)
		}
	})
	return at
}

// pollWait is how long a poll may wait for records: half the checkpoint
// interval, less when the epoch is due sooner (else, when the input goes
// quiet, its barrier would wait for the poll: up to half an interval late,
// found by the 1 s latency benchmark) or a processing-time timer is due
// sooner on the wall clock, nothing when the loop was woken (a restore
// finished, a test clock moved) since the last poll.
func (l *loop) pollWait() time.Duration {
	if l.in.woken.Swap(false) {
		return 0
	}
	for _, t := range l.tasks {
		if t.eventTimersDue() {
			return 0 // left by the bound on a burst (refreshEventTime)
		}
	}
	wall := time.Now()
	d := l.byDue(max(l.in.cfg.Checkpoint.Interval/2, 5*time.Millisecond), wall)
	if l.in.cfg.Clock != nil {
		return d // a test clock wakes the loop when it moves
	}
	now := wall.UnixMilli()
	for _, t := range l.tasks {
		if next := t.timers.next[kstate.ProcessingTime]; next != never {
			d = min(d, time.Duration(max(next-now, 0))*time.Millisecond)
		}
	}
	return d
}

// fireTimers fires the processing-time timers that are due, at most a
// poll's worth per iteration, and the event-time timers idle inputs
// released; then it sweeps expired state.
func (l *loop) fireTimers() error {
	if l.coord.Phase() != barrier.Processing && l.pipe == nil {
		// The final checkpoint is done: nothing may join an epoch now.
		// (During an overlap the timers join the epoch being
		// processed, as its records do: pipelined.go.)
		return nil
	}
	firedP, firedE, err := l.fireBetweenPolls()
	if err != nil {
		return err
	}
	if firedP || firedE {
		if err := l.run(l.coord.Work(time.Now())); err != nil {
			return err
		}
	}
	if l.budgetFull.Swap(false) {
		if err := l.budgetCheckpoint(); err != nil {
			return err
		}
	}
	return l.sweepTTL()
}

// fireBetweenPolls fires the due processing-time timers and the event-time
// timers idle inputs let through, with betweenPolls set.
func (l *loop) fireBetweenPolls() (firedP, firedE bool, err error) {
	l.betweenPolls = true
	defer func() { l.betweenPolls = false }()
	if firedP, err = l.fireProcessingTimers(l.in.cfg.MaxPollRecords); err != nil {
		return firedP, false, err
	}
	firedE, err = l.refreshEventTime()
	return firedP, firedE, err
}

func (l *loop) joined() bool { return l.in.inGroup(l.sess.Client()) }

// process runs the job over the polled records, in partition order (for
// several input topics, see processMerged); tasks may process theirs in
// parallel (parallel.go).
func (l *loop) process(fs kgo.Fetches) error {
	if len(fs) == 0 {
		return nil
	}
	if len(l.in.cfg.InputTopics) > 1 {
		return l.processMerged(fs)
	}
	in := l.in
	rewind := offsets{}
	// Each running task's batches of the poll, in the poll's order: a
	// partition may come in more than one (from two brokers' fetches
	// around a leader change), and a task's records are processed by one
	// worker in order.
	var batches [][]kgo.FetchTopicPartition
	at := map[int32]int{}
	fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
		if len(ftp.Records) == 0 {
			return
		}
		t := l.tasks[ftp.Partition]
		if t == nil {
			// Fetched before the pause took hold; the task is not
			// running, so fetch these again once it is.
			rewind.set(ftp.Topic, ftp.Partition, ftp.Records[0].Offset)
			return
		}
		last := ftp.Records[len(ftp.Records)-1]
		in.m.lag.WithLabelValues(ftp.Topic, t.label).Set(float64(max(0, ftp.HighWatermark-last.Offset-1)))
		i, ok := at[ftp.Partition]
		if !ok {
			i = len(batches)
			at[ftp.Partition] = i
			batches = append(batches, nil)
		}
		batches[i] = append(batches[i], ftp)
	})
	if len(batches) > 0 {
		in.m.pollPartitions.Observe(float64(len(batches)))
	}
	down := false // a Prefetch found its service unavailable in this fetch
	worked, err := l.eachTask(len(batches), rewind, func(i int, rewind offsets) (bool, error) {
		t := l.tasks[batches[i][0].Partition]
		worked := false
		for _, ftp := range batches[i] {
			if in.cfg.Job.Prefetch != nil {
				if ok, err := l.prefetch(t, ftp, rewind, &down); !ok || err != nil {
					return worked, err
				}
			}
			t.beginBatch(in)
			c := t.cursor(ftp.Topic)
			for _, r := range ftp.Records {
				took, stop, err := l.takeAt(t, &c, r, rewind)
				if err != nil || stop {
					c.save(t, ftp.Topic)
					return worked, err
				}
				worked = worked || took
			}
			c.save(t, ftp.Topic)
		}
		return worked, nil
	})
	return l.afterProcess(rewind, worked, down, err)
}

// take processes one polled record of running task t, unless its effects
// are in the state already. stop says the rest of the task's records must
// wait (the replay of a refused commit ends here: see task.replayUntil),
// and rewind then holds where they are fetched again from.
func (l *loop) take(t *task, r *kgo.Record, rewind offsets) (took, stop bool, err error) {
	c := t.cursor(r.Topic)
	took, stop, err = l.takeAt(t, &c, r, rewind)
	c.save(t, r.Topic)
	return took, stop, err
}

// takeAt is take with the task's offsets of r's topic read already, into
// c: a batch of one topic's records reads them once (three map lookups a
// record were 2-3 % of aggregate's CPU), and the task's next offset is
// written once, by c.save after the batch (a map write a record was 1-2
// %): nothing reads it while records are processed, only at the epoch's
// end, after process returned. No record of the batch comes before one
// taken, so c.next stays right for the batch without being moved;
// replayUntil does not change while records are processed.
func (l *loop) takeAt(t *task, c *cursor, r *kgo.Record, rewind offsets) (took, stop bool, err error) {
	if c.hasNext && r.Offset < c.next {
		return false, false, nil // reflected in state already
	}
	if c.hasUntil && r.Offset >= c.until {
		// The replay of a refused commit ends where the refused attempt
		// did; the rest comes again.
		rewind.set(r.Topic, r.Partition, r.Offset)
		l.budgetFull.Store(true)
		return false, true, nil
	}
	if !c.hasCommitted {
		// First record of a task with no committed offset: an abort
		// rewinds to here.
		t.committed[r.Topic] = r.Offset
		c.hasCommitted = true
	}
	if err := l.begin(); err != nil {
		return true, false, err
	}
	c.taken, c.moved = r.Offset+1, true
	return true, false, l.processOne(t, r)
}

// cursor is what take reads of a task's offsets of one topic, and the
// next offset past the records it took (taken, once moved).
type cursor struct {
	next, until, taken                     int64
	hasNext, hasUntil, hasCommitted, moved bool
}

// save moves the task's next offset of topic past the records c took.
func (c *cursor) save(t *task, topic string) {
	if c.moved {
		t.next[topic] = c.taken
	}
}

func (t *task) cursor(topic string) cursor {
	var c cursor
	c.next, c.hasNext = t.next[topic]
	c.until, c.hasUntil = t.replayUntil[topic]
	_, c.hasCommitted = t.committed[topic]
	return c
}

// afterProcess places the consumer where records must be fetched again,
// waits a little when a Prefetch found its service unavailable (down),
// tells the coordinator about work done, and ends the epoch early when a
// task's write-set reached the epoch budget.
func (l *loop) afterProcess(rewind offsets, worked, down bool, err error) error {
	if len(rewind) > 0 {
		l.sess.Client().SetOffsets(rewind)
	}
	if err != nil {
		return err
	}
	// Work is reported before any wait: a shutdown that ends the wait
	// must find it for the final checkpoint (found by review).
	if worked {
		if err := l.run(l.coord.Work(time.Now())); err != nil {
			return err
		}
	}
	if down {
		// The batches come again once the service may be back; the
		// epoch's other work still commits meanwhile (the loop goes on
		// after the wait), and on time: the wait ends by the epoch's due
		// time, after which the batches may be tried again a little
		// sooner than the backoff said (found by review).
		if err := sleep(l.ctx, l.unavailableWait()); err != nil {
			return nil // shutting down
		}
	}
	if l.budgetFull.Swap(false) {
		return l.budgetCheckpoint()
	}
	return nil
}

// budgetCheckpoint ends the epoch early: a task's write-set reached the
// epoch budget. A commit under way ends first (pipelined.go), so that the
// epoch being processed can end.
func (l *loop) budgetCheckpoint() error {
	if err := l.waitPipe(); err != nil {
		return err
	}
	return l.run(l.coord.RequestCheckpoint(time.Now()))
}

// unavailableWait is how long the loop waits before the batches whose
// service was unavailable come again: the backoff, but no later than the
// epoch's due time.
func (l *loop) unavailableWait() time.Duration {
	return l.byDue(l.unavailableFor, time.Now())
}

// byDue cuts a wait of d starting at wall time now so that it ends by the
// epoch's due time, if it has one. (The coordinator keeps wall time, even
// under a test clock.)
func (l *loop) byDue(d time.Duration, now time.Time) time.Duration {
	if due, ok := l.coord.Due(); ok {
		d = min(d, max(due.Sub(now), 0))
	}
	return d
}

// Bounds of the wait between attempts while Job.Prefetch finds its service
// unavailable; it doubles from the first to the last.
const (
	unavailableMinWait = 50 * time.Millisecond
	unavailableMaxWait = time.Second
)

// prefetch hands a partition's batch to Job.Prefetch: the records process
// would process, those not reflected in state yet and before a replay's
// bound, the same filter as its loop. It reports whether the batch may be
// processed. When the service is unavailable (now, or for an earlier
// partition of the same fetch, *down) the partition is rewound to the
// batch's first such record and nothing of it is processed: Ordering rule:
// no record is processed, so none is committed, before the answers it
// depends on were received.
func (l *loop) prefetch(t *task, ftp kgo.FetchTopicPartition, rewind offsets, down *bool) (bool, error) {
	in := l.in
	var recs []*Record
	for _, r := range ftp.Records {
		if next, ok := t.next[r.Topic]; ok && r.Offset < next {
			continue
		}
		if until, ok := t.replayUntil[r.Topic]; ok && r.Offset >= until {
			break
		}
		recs = append(recs, apiRecord(r))
	}
	if len(recs) == 0 {
		return true, nil
	}
	var err error
	if !*down {
		err = in.cfg.Job.Prefetch(batchContext{ctx: l.ctx, t: t, now: in.clock.Now()}, recs)
		// Prefetch reads only; a lazy TTL expiry it triggered is done
		// again by Process, in the record's own write-set.
		t.store.RollbackRecord()
		if l.ctx.Err() != nil {
			// Shutting down: the batch comes again after the restart,
			// and the loop goes on to the final checkpoint instead of
			// stopping on the cancelled call's error (found by review).
			rewind.set(ftp.Topic, ftp.Partition, recs[0].Offset)
			return false, nil
		}
	}
	var ue *UnavailableError
	switch {
	case *down || errors.As(err, &ue):
		rewind.set(ftp.Topic, ftp.Partition, recs[0].Offset)
		if !*down {
			*down = true
			l.unavailable = true
			in.ready.Store(false)
			l.unavailableFor = min(max(2*l.unavailableFor, unavailableMinWait), unavailableMaxWait)
			in.log.Warn("job's service unavailable; the batch waits", "job", in.cfg.Job.Name, "task", t.p, "topic", ftp.Topic, "offset", recs[0].Offset, "retry_in", l.unavailableFor, "err", err)
		}
		return false, nil
	case err != nil:
		return false, fmt.Errorf("job %s: task %d offset %d: prefetch: %w", in.cfg.Job.Name, t.p, recs[0].Offset, err)
	}
	if l.unavailable {
		in.log.Info("job's service is back", "job", in.cfg.Job.Name, "task", t.p)
	}
	l.unavailable, l.unavailableFor = false, 0
	return true, nil
}

// batchContext is the PrefetchContext of a task's batch.
type batchContext struct {
	ctx context.Context
	t   *task
	now time.Time
}

func (c batchContext) Context() context.Context { return c.ctx }
func (c batchContext) Task() int32              { return c.t.p }
func (c batchContext) Now() time.Time           { return c.now }
func (c batchContext) Store() *kstate.Store     { return c.t.store }
func (c batchContext) CurrentWatermark() time.Time {
	return c.t.watermark()
}

// processOne processes r, which takeAt took: the epoch's transaction is
// open and the task's next offset moves past r once the batch is done.
func (l *loop) processOne(t *task, r *kgo.Record) error {
	in := l.in
	t.advanced = true
	t.inCount++

	ref := recordRef(r)
	var ps *poison
	if len(t.poison) > 0 {
		if ps = t.poison[ref]; ps != nil && ps.confirmed {
			return l.deadLetterEmit(t, ref, in.deadLetter(r, ps.err, "emit"), ps)
		}
	}
	rec := t.inputRecord(r)
	ts := r.Timestamp
	if in.cfg.Job.Timestamp != nil {
		var err error
		if ts, err = in.cfg.Job.Timestamp(rec); err != nil {
			if IsFatal(err) {
				return fmt.Errorf("job %s: task %d offset %d: timestamp: %w", in.cfg.Job.Name, t.p, r.Offset, err)
			}
			l.produceFor(t, ref, in.deadLetter(r, err, "timestamp"), true)
			t.processingErrors.Inc()
			t.dlq.Inc()
			return nil
		}
	}
	now := t.processingTime(in)
	rc := &t.rc
	rc.ctx, rc.in, rc.key, rc.now, rc.ts, rc.out = l.ctx, in, r.Key, now, ts, rc.out[:0]
	rc.wall = in.outputStamp(now)
	rc.rows = rc.rows[:0] // sink rows (sink.go)
	err := in.cfg.Job.Process(rc, rec)
	t.noteRegistered()
	if err == nil {
		// A write the store refused (a key too long for bbolt, a value
		// too large for the changelog) fails the record even if the job
		// ignored the error.
		err = t.store.RecordErr()
	}
	switch {
	case err == nil:
		l.commitHandled(t, ref, ps, rc.out)
	case IsFatal(err):
		t.undo()
		return fmt.Errorf("job %s: task %d offset %d: %w", in.cfg.Job.Name, t.p, r.Offset, err)
	default:
		t.undo()
		stage := "process"
		var de *DecodeError
		var se *StageError
		switch {
		case errors.As(err, &se):
			stage = se.Stage
		case errors.As(err, &de):
			stage = "decode"
		}
		l.produceFor(t, ref, in.deadLetter(r, err, stage), true)
		t.processingErrors.Inc()
		t.dlq.Inc()
	}
	clear(rc.out)
	// The watermark moves after the record, and the event-time timers it
	// passes fire before the next record (see timers.go), as do timers the
	// record registered at or behind the watermark.
	if in.cfg.Job.EventTime {
		t.clock.observe(r.Topic, ts, now)
		if in.cfg.Job.Prefetch != nil {
			// The batch's answers were computed before it: a timer
			// firing inside it would change a key's state under an
			// answer computed before the change. Its timers fire
			// after the batch, between polls (refreshEventTime).
			return nil
		}
		n, err := l.fireEventTimers(t)
		if n > 0 {
			// Timers read the clock afresh; the records after them
			// must not see an older time (proctime.go).
			t.beginBatch(in)
		}
		return err
	}
	return nil
}

// outputStamp is the timestamp of outputs made at processing time now: now
// itself on the wall clock, zero (franz-go stamps them when produced) under
// a test clock, whose time is not a wall time.
func (in *Instance) outputStamp(now time.Time) time.Time {
	if in.cfg.Clock != nil {
		return time.Time{}
	}
	return now
}

// commitHandled folds the writes of a record or timer that succeeded into
// the epoch and produces its outputs (alone, for a suspect: see poison.go).
func (l *loop) commitHandled(t *task, ref inputRef, ps *poison, out []*kgo.Record) {
	t.store.CommitRecord()
	t.sinkRows(l.in, t.rc.rows) // sink.go
	l.noteBudget(t)
	if ps != nil {
		l.produceAlone(t, ref, ps, out)
	} else {
		for _, o := range out {
			l.produceFor(t, ref, o, false)
		}
	}
	t.outCount += len(out)
}

// noteBudget ends the epoch early once a task's write-set reaches the
// epoch budget (Options.EpochMaxKeys, EpochMaxBytes).
func (l *loop) noteBudget(t *task) {
	st := t.store
	if st.DirtyLen() >= l.in.cfg.EpochMaxKeys || max(st.DirtyBytes(), st.EpochMemory()) >= l.in.cfg.EpochMaxBytes {
		l.budgetFull.Store(true)
	}
}

// begin opens the epoch's transaction if it is not open yet. Tasks
// processed in parallel may call it at once: the first opens it, the
// others find it open (and produce only after it is).
func (l *loop) begin() error {
	if l.inTxn.Load() {
		return nil
	}
	l.txnMu.Lock()
	defer l.txnMu.Unlock()
	if l.inTxn.Load() {
		return nil
	}
	if err := l.sess.Begin(); err != nil {
		return fmt.Errorf("%w: begin: %w", errSessionBroken, err)
	}
	l.in.txnOpenedAt.Store(time.Now().UnixNano())
	l.inTxn.Store(true)
	return nil
}

// produce adds r, a changelog record or marker, to the open epoch. The
// context is never cancelled: a record failed by its own context is simply
// not sent, and the transaction would still commit without it (shutdown is
// handled by the final checkpoint, not by cancelling produces).
func (l *loop) produce(r *kgo.Record) { l.send(r, l.plainPromise) }

// plainPromised is the promise of produce (l.plainPromise, made once).
func (l *loop) plainPromised(r *kgo.Record, err error) {
	if err != nil {
		l.noteProduceErr(r, err)
	}
	l.recycled(r)
}

// noteProduceErr keeps the epoch's first failed produce; the epoch then
// cannot commit.
func (l *loop) noteProduceErr(r *kgo.Record, err error) {
	l.in.noteMissingTopic(r.Topic, err)
	err = fmt.Errorf("%w: %s/%d: %w", txsink.ErrProduce, r.Topic, r.Partition, err)
	l.produceErr.CompareAndSwap(nil, &err)
}

// run carries out the coordinator's actions until it has nothing to do.
func (l *loop) run(act barrier.Action) error {
	in := l.in
	if l.processing.Load() {
		// An epoch ended, aborted or applied under the records being
		// processed, perhaps by another task's worker, would split a
		// record's effects from its offset (parallel.go).
		return errors.New("sluice: internal error: the checkpoint coordinator ran while a poll's records were processed")
	}
	for {
		now := time.Now()
		switch act.Kind {
		case barrier.ActNone:
			return nil

		case barrier.ActEndEpoch:
			// Alignment is immediate: this goroutine processed every
			// record polled before the barrier. Each task hands over
			// by producing its dirty keys (and, exactly-once, its
			// marker at once: one transaction holds both).
			// Every record of the epoch is counted before its points
			// (a hook may read the counters).
			l.flushCounts()
			in.cfg.at(PointBeforePreCommit)
			start := now
			records := 0
			next := barrier.Action{}
			for _, p := range act.Tasks {
				if t := l.tasks[p]; t != nil {
					n, err := l.preCommit(t)
					if err != nil {
						l.fatal = err
						return err
					}
					records += n
				}
				next = l.coord.TaskReady(p, time.Now())
			}
			if records > 0 {
				in.m.changelogPerEpoch.Observe(float64(records))
			}
			act = next
			l.ckptAt = start

		case barrier.ActCommit:
			act = l.commit(act)

		case barrier.ActApply:
			act = l.apply(act.Tasks)
			// The epoch after it was processed during its commit
			// (pipelined.go): its records go out now, in its own
			// transaction, before anything else of it.
			if l.fatal != nil {
				l.dropHeld() // the apply failed: the instance stops
			} else if err := l.releaseHeld(); err != nil {
				return err
			}

		case barrier.ActAbort:
			in.log.Warn("epoch aborted", "epoch", act.Epoch, "reason", act.Reason, "err", act.Err)
			in.logMissingTopic()
			in.m.checkpointFailures.Inc()
			if err := l.abort(); err != nil {
				return err
			}
			if l.fatal != nil {
				return l.fatal // a sink error retrying cannot fix (sink.go)
			}
			act = l.coord.Aborted(time.Now())

		case barrier.ActFail:
			if l.fatal != nil {
				return l.fatal
			}
			// Flink's answer to too many failed checkpoints is a
			// restart from the last completed one; ours is a new
			// session over the local stores.
			in.logMissingTopic()
			in.m.checkpointFailures.Inc()
			return fmt.Errorf("%w: %w", errSessionBroken, act.Err)

		default:
			return fmt.Errorf("sluice: unknown barrier action %v", act.Kind)
		}
	}
}

// preCommit produces a task's changelog entries for the epoch, and under
// exactly-once its marker.
func (l *loop) preCommit(t *task) (int, error) {
	if len(t.orphans) > 0 || t.advanced || t.store.DirtyLen() > 0 {
		if err := l.begin(); err != nil {
			return 0, err
		}
	}
	n, err := t.preCommit(l.in, l.produce)
	if err != nil || !t.pending() || l.in.cfg.Guarantee != ExactlyOnce {
		return n, err
	}
	t.produceMarker(l.in, l.produce)
	return n + 1, nil
}

// commit ends the epoch's transaction. The session flushes every output,
// changelog record and marker before TxnOffsetCommit and EndTxn. With
// pipelined epochs the flush runs while the loop goes on (pipelined.go),
// and the coordinator stays committing until finishPipe ends the commit.
func (l *loop) commit(act barrier.Action) barrier.Action {
	in := l.in
	if !l.inTxn.Load() {
		// Tasks were ready but nothing was consumed: nothing to end.
		return l.coord.CommitDone(time.Now())
	}
	if at := in.txnOpenedAt.Load(); at != 0 {
		in.commitTxnAge.Store(int64(time.Since(time.Unix(0, at))))
	}
	if l.overlaps(act) {
		// Nothing was polled since the barrier: the consumer's
		// positions are checked now, as the flush would leave them.
		if err := l.startPipe(l.alignOffsets()); err != nil {
			l.fatal = err
			return l.coord.CommitFailed(err, time.Now())
		}
		return barrier.Action{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), in.cfg.Checkpoint.Timeout)
	defer cancel()
	// Ordering rule: every output, changelog record and marker is
	// acknowledged before the offsets commit and EndTxn is sent; a record
	// that failed aborts the epoch.
	if act, ok := l.flushChecked(ctx); !ok {
		return act
	}
	if in.cfg.Guarantee == AtLeastOnce {
		// Ordering rule (at-least-once): the markers go out only once
		// every output and changelog entry of the epoch is acknowledged.
		// Nothing aborts a durable marker, and a restore resumes at it:
		// a marker next to a failed output would skip that output's
		// input for good.
		for _, p := range l.taskList() {
			if t := l.tasks[p]; t.pending() {
				t.produceMarker(in, l.produce)
			}
		}
		if act, ok := l.flushChecked(ctx); !ok {
			return act
		}
	}
	offsets := l.alignOffsets()
	// The sink's pre-commit (sink.go): after every Kafka record is
	// acknowledged, before EndTxn.
	if act, ok := l.sinkPreCommit(ctx); !ok {
		return act
	}
	return l.endTxn(ctx, offsets)
}

// endTxn commits the epoch's transaction, whose records were all
// acknowledged, with offsets for the TxnOffsetCommit.
func (l *loop) endTxn(ctx context.Context, offsets offsets) barrier.Action {
	in := l.in
	in.cfg.at(PointBeforeCommit)
	stop := l.yieldToRebalance()
	committed, err := l.sess.End(ctx, true, offsets)
	stop()
	l.inTxn.Store(false)
	in.txnOpenedAt.Store(0)
	if perr := l.produceErr.Swap(nil); perr != nil && committed {
		// Everything was flushed and checked above, so nothing can
		// fail here; if something did, Kafka holds an epoch with a
		// record missing, and only an operator can judge it.
		l.fatal = fmt.Errorf("sluice: a record failed after the flush but the transaction committed: %w", *perr)
		l.coord.CommitDone(time.Now())
		return l.coord.ApplyFailed(l.fatal, time.Now())
	}
	switch {
	case err != nil:
		in.m.transactions.WithLabelValues("abort").Inc()
		l.sinkUnknown() // EndTxn's outcome is unknown: the restores decide
		l.sessionBroken(err)
		return l.coord.CommitFailed(err, time.Now())
	case !committed:
		in.m.transactions.WithLabelValues("abort").Inc()
		return l.coord.CommitFailed(errAborted, time.Now())
	}
	in.m.transactions.WithLabelValues("commit").Inc()
	in.missingTopic.Store(nil)
	if in.log.Enabled(context.Background(), slog.LevelDebug) {
		for p, t := range l.tasks {
			if e := t.ending(); e.marker != nil {
				in.log.Debug("epoch committed", "task", p, "epoch", t.epoch+1, "next", e.next, "marker_offset", e.marker.Offset)
			}
		}
	}
	in.cfg.at(PointAfterCommit)
	if err := l.sinkCommitted(); err != nil {
		l.fatal = fmt.Errorf("sluice: sink: %w", err)
		l.coord.CommitDone(time.Now())
		return l.coord.ApplyFailed(l.fatal, time.Now())
	}
	return l.coord.CommitDone(time.Now())
}

// flushChecked waits for everything produced in the epoch and reports
// whether all of it was acknowledged; if not, the commit failed and the
// returned action says what to do next.
func (l *loop) flushChecked(ctx context.Context) (barrier.Action, bool) {
	return l.checkFlushed(l.sess.Client().Flush(ctx))
}

// checkFlushed is flushChecked after the flush returned err.
func (l *loop) checkFlushed(err error) (barrier.Action, bool) {
	if err != nil {
		l.sessionBroken(err)
		return l.coord.CommitFailed(fmt.Errorf("flush: %w", err), time.Now()), false
	}
	if perr := l.produceErr.Swap(nil); perr != nil {
		if l.refused.Load() || l.learnsSomething() {
			// An input's output can never be produced: the replay
			// deals with it (see poison.go).
			l.refused.Store(true)
			return l.coord.CommitRefused(*perr, time.Now()), false
		}
		return l.coord.CommitFailed(*perr, time.Now()), false
	}
	return barrier.Action{}, true
}

// alignOffsets makes the offsets the session is about to commit equal the
// ones the markers carry, and returns those of the tasks that wrote a
// marker this epoch. They agree by construction (every record polled for a
// running task is processed, others are rewound); a disagreement would
// commit offsets without their state, so it is logged and repaired rather
// than committed. A partition whose task is not running must commit
// nothing new.
func (l *loop) alignOffsets() offsets {
	cl := l.sess.Client()
	committed := cl.CommittedOffsets()
	fix := offsets{}
	for topic, heads := range cl.UncommittedOffsets() {
		for p, head := range heads {
			var want int64
			ok := false
			if t := l.tasks[p]; t != nil {
				want, ok = t.next[topic]
			}
			if !ok {
				var c kgo.EpochOffset
				c, ok = committed[topic][p]
				want = c.Offset
			}
			if !ok || head.Offset == want {
				continue
			}
			l.in.log.Error("consumer position disagrees with the task's offsets; realigning", "topic", topic, "partition", p,
				"consumer", head.Offset, "want", want, "running", l.tasks[p] != nil)
			fix.set(topic, p, want)
		}
	}
	if len(fix) > 0 {
		cl.SetOffsets(fix)
	}
	marked := offsets{}
	for p, t := range l.tasks {
		if t.marker != nil {
			marked.setAll(p, t.next)
		}
	}
	return marked
}

// yieldToRebalance lets a rebalance that starts while the epoch commits
// go ahead instead of waiting for the commit. The commit needs a heartbeat,
// and after a session timeout the group can only move on (and tell the
// session its partitions are lost) once the rebalance callbacks run: held
// back, the commit would wait out its timeout. A revoke or loss during the
// commit makes the session abort the epoch, which is the right outcome; a
// cooperative rebalance that takes nothing lets it commit. The returned
// function stops watching.
func (l *loop) yieldToRebalance() func() {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-l.in.rebalanceWaits:
			l.sess.AllowRebalance()
		case <-done:
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// sessionBroken records that the session must be rebuilt once the epoch's
// abort is done.
func (l *loop) sessionBroken(err error) { l.brokenErr = err }

// abort drops the open epoch everywhere: the transaction (if the session
// still works), every task's write-set, and the consumer positions, which go
// back to the tasks' committed offsets.
func (l *loop) abort() error {
	// The epoch after the one committing goes with it. The session must
	// not end the transaction while the flush runs.
	l.takePipe(true)
	l.dropHeld()
	l.sinkAborted()
	// End even without an open transaction: it clears the session's
	// revoked flag, which would otherwise abort the next epoch too.
	if l.brokenErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), l.in.cfg.Checkpoint.Timeout)
		_, err := l.sess.End(ctx, false, nil)
		cancel()
		if err != nil {
			l.brokenErr = err
		}
	}
	l.inTxn.Store(false)
	l.bcRestart = true
	l.in.txnOpenedAt.Store(0)
	l.produceErr.Store(nil)
	refused := l.refused.Swap(false)
	l.learnPoison()
	overlapped := false // the epoch refused was committing during the next one
	for _, t := range l.tasks {
		overlapped = overlapped || t.sealed != nil
	}
	rewind := offsets{}
	for p, t := range l.tasks {
		// A bound stays until the epoch that reaches it commits (apply
		// clears it): an abort for another reason, or a refused replay
		// of a task that did not advance, must not let the replay take
		// in new records.
		// The refused epoch is the sealed one if it was committing
		// during the next; a task without one ended nothing in it.
		if e := t.ending(); refused && e.advanced && (t.sealed != nil || !overlapped) {
			t.replayUntil = maps.Clone(e.next)
		}
		t.discard(l.in.cfg.Guarantee == AtLeastOnce)
		rewind.setAll(p, t.committed)
	}
	if l.brokenErr != nil {
		err := l.brokenErr
		return fmt.Errorf("%w: %w", errSessionBroken, err)
	}
	l.sess.Client().SetOffsets(rewind)
	return nil
}

// release handles partitions revoked or lost in the last poll. Revoked
// partitions had their work committed when the rebalance asked for it
// (RequestRevoke); anything processed since is aborted, as it is for lost
// partitions. The session marked the transaction for abort either way, so
// it is ended now, which also rewinds the consumer to the committed
// offsets.
func (l *loop) release(why string, gone []int32) error {
	l.in.log.Info("partitions released", "tasks", gone, "why", why)
	// The released tasks' records that failed for a missing topic are
	// another owner's now; the kept tasks' note it again if theirs fail.
	l.in.missingTopic.Store(nil)
	act := barrier.Action{}
	if l.coord.Phase() == barrier.Processing && l.inTxn.Load() {
		act = l.coord.EpochFailed(errAborted, time.Now())
	}
	if act.Kind != barrier.ActNone {
		if err := l.run(act); err != nil {
			return err
		}
	} else if err := l.abort(); err != nil {
		return err
	}
	// A released task's backend is closed: its write ends first.
	if err := l.settleOrStop(true); err != nil {
		return err
	}
	for _, p := range gone {
		l.in.queries.drop(p) // before its backend closes
		if job := l.restoring[p]; job != nil {
			job.cancel()
			if r := <-job.result; r.err == nil {
				r.be.Close()
			}
			delete(l.restoring, p)
			l.in.m.tasks.WithLabelValues("restoring").Dec()
		}
		if t := l.tasks[p]; t != nil {
			if err := t.store.Backend().Close(); err != nil {
				l.in.log.Warn("closing task store", "task", p, "err", err)
			}
			delete(l.tasks, p)
			l.in.m.tasks.WithLabelValues("running").Dec()
		}
		l.in.m.forgetTask(p, l.in.cfg.InputTopics)
		l.pauseOwned(p)
	}
	l.in.standbys.releaseActive(gone...)
	// A batch that waited for its service may have been the released
	// task's: the next Prefetch says again whether the service is down.
	l.unavailable = false
	return l.run(l.coord.SetTasks(l.taskList()))
}

func (l *loop) taskList() []int32 {
	ps := make([]int32, 0, len(l.tasks))
	for p := range l.tasks {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// startRestore opens the task's store and brings it up to date from its
// changelog partition in a goroutine of its own; the task's input stays
// paused until the loop installs the result.
func (l *loop) startRestore(p int32) { l.startRestoreAfter(p, 0) }

func (l *loop) startRestoreAfter(p int32, delay time.Duration) {
	in := l.in
	if l.tasks[p] != nil || l.restoring[p] != nil {
		return
	}
	ctx, cancel := context.WithCancel(l.ctx)
	job := &restoreJob{cancel: cancel, result: make(chan restoreResult, 1)}
	l.restoring[p] = job
	in.m.tasks.WithLabelValues("restoring").Inc()
	in.queries.restore(p)
	go func() {
		r := restoreResult{p: p, err: sleep(ctx, delay)}
		if r.err == nil {
			r = in.restore(ctx, p)
		}
		job.result <- r
		in.wakeLoop()
	}()
}

// installRestored turns finished restores into running tasks: the consumer
// is placed at the offsets the store reflects (the marker is the truth;
// the group's committed offsets agree with it) and fetching resumes.
func (l *loop) installRestored() error {
	if l.pipe != nil {
		// The task set changes only between checkpoints: a restored
		// task waits for the commit under way.
		ready := false
		for _, job := range l.restoring {
			ready = ready || len(job.result) > 0
		}
		if !ready {
			return nil
		}
		if err := l.waitPipe(); err != nil {
			return err
		}
	}
	var installed []*task
	for p, job := range l.restoring {
		var r restoreResult
		select {
		case r = <-job.result:
		default:
			continue
		}
		delete(l.restoring, p)
		l.in.m.tasks.WithLabelValues("restoring").Dec()
		if r.err != nil {
			if l.ctx.Err() != nil {
				continue
			}
			if final := l.in.denied(l.ctx, r.err); final != nil {
				return final
			}
			if final := sinkFinal(r.err); final != nil {
				return fmt.Errorf("sluice: %w", final)
			}
			l.in.log.Error("restore failed; retrying", "task", p, "err", r.err)
			l.startRestoreAfter(p, time.Second)
			continue
		}
		t, err := newTask(l.in, p, r.be, r.meta)
		if err != nil {
			r.be.Close()
			return err
		}
		for _, k := range r.orphans {
			t.orphan(k)
		}
		l.tasks[p] = t
		l.in.standbys.noteCopy(p, r.meta.ChangelogOffset, 0)
		l.in.queries.run(p, r.be)
		l.in.m.epoch.WithLabelValues(t.label).Set(float64(t.epoch))
		l.in.m.tasks.WithLabelValues("running").Inc()
		// The marker is the truth for where the task resumes.
		at := offsets{}
		at.setAll(p, t.committed)
		cl := l.sess.Client()
		cl.SetOffsets(at)
		resume := map[string][]int32{}
		for _, topic := range l.in.cfg.InputTopics {
			resume[topic] = []int32{p}
		}
		cl.ResumeFetchPartitions(resume)
		installed = append(installed, t)
		l.bcRestart = true
	}
	if len(installed) == 0 {
		return nil
	}
	l.learnEnds(installed) // before the next poll brings their records
	return l.run(l.coord.SetTasks(l.taskList()))
}

// shutdown takes the final checkpoint and closes the session (deferred).
func (l *loop) shutdown() error {
	err := l.waitPipe()
	if err == nil {
		err = l.run(l.coord.RequestShutdown(time.Now()))
	}
	if err != nil {
		l.in.log.Warn("final checkpoint failed; the next start replays the epoch", "err", err)
	}
	l.sinkShutdown()
	return nil
}

// close ends the session: restores are cancelled, stores closed, the client
// closed. Uncommitted work is dropped; the broker aborts an open
// transaction when the next session (or the transaction timeout) fences it.
// It returns the error of an epoch's write that failed (see settleApply).
func (l *loop) close() error {
	l.learnPoison() // the next session starts with what this one learned
	l.in.ready.Store(false)
	l.in.queries.dropAll() // before the backends close
	for p, job := range l.restoring {
		job.cancel()
		if r := <-job.result; r.err == nil {
			r.be.Close()
		}
		delete(l.restoring, p)
		l.in.m.forgetTask(p, l.in.cfg.InputTopics)
	}
	// A rebalance held back by the last poll would make Close wait for
	// it forever.
	l.sess.AllowRebalance()
	if l.pipe != nil {
		// The sealed epoch's sink pre-commit, if its flush is done,
		// stops: its Kafka transaction will never end, and nothing
		// should be prepared for it after the session closed.
		l.pipe.cancel()
	}
	l.sess.Close()
	l.takePipe(true) // the client is closed: the flush returns
	l.dropHeld()
	if l.bc != nil {
		l.bc.stop()
	}
	// The backends' writes end before they close; one that failed leaves
	// its backend behind the changelog, which the next start restores.
	applyErr := l.settleOrStop(true)
	if applyErr != nil {
		l.in.log.Warn("applying the last epoch to a task store failed; the next start restores it from the changelog", "err", applyErr)
	}
	for p, t := range l.tasks {
		if err := t.store.Backend().Close(); err != nil {
			l.in.log.Warn("closing task store", "task", p, "err", err)
		}
		// The next session, or Run, may not get the task back: no
		// frozen lag or epoch of it should stay exported here.
		l.in.m.forgetTask(p, l.in.cfg.InputTopics)
	}
	l.in.m.tasks.Reset()
	l.in.standbys.releaseAll() // after the gauge's reset: it counts the standbys again
	l.in.txnOpenedAt.Store(0)  // an open transaction died with the session
	return applyErr
}
