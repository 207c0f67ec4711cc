package barrier

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Coordinator is the checkpoint coordinator of one processor instance: a
// state machine that the engine's loop goroutine drives with events and that
// answers each with the Action to take next. It does no I/O and reads no
// clock: every event carries the time. It is not safe for concurrent use;
// one goroutine owns it.
//
// Epoch numbers are the ones the changelog markers carry. The current epoch
// is the one being processed, or, during a checkpoint, the one being
// checkpointed. A committed epoch E is followed by E+1 (Applied). A failed
// epoch E is retried as E (Aborted): nothing of E reached Kafka or the
// backends, so its number is free, and keeping it means markers on every
// task partition stay consecutive. Epoch numbers never decrease.
//
// At most one checkpoint is in flight: the next barrier comes only after
// Applied or Aborted.
type Coordinator struct {
	cfg   Config
	phase Phase
	epoch uint64
	tasks []int32 // the current task set, ascending

	epochStart time.Time // when the current epoch began: see Config.Interval
	lastEnd    time.Time // when the last checkpoint ended (Applied, Aborted), or New
	hasWork    bool      // the current epoch processed a record before its barrier

	// The checkpoint in flight, from its barrier to Applied or Aborted.
	ckptTasks  []int32            // the tasks asked to hand over, ascending
	unready    map[int32]struct{} // those that have not yet
	ckptStart  time.Time          // the barrier
	ckptReason Reason
	nextWork   bool // the epoch after the barrier has work (overlap)

	// Requests that wait for the checkpoint in flight to end.
	savepointPending bool
	shutdown         bool // sticky: once asked, the instance winds down
	revoke           bool // until nothing uncommitted is left

	failures int

	failReason Reason
	failErr    error
}

// New returns a Coordinator in Processing for firstEpoch, the epoch after
// the last one committed (restored from the backends' meta; any number is
// accepted). Its task set is empty until SetTasks. now is taken as the end
// of the previous checkpoint, so MinPause applies to the first one too.
//
// New panics if cfg does not Validate: check it where it is built.
func New(cfg Config, now time.Time, firstEpoch uint64) *Coordinator {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return &Coordinator{
		cfg:        cfg,
		phase:      Processing,
		epoch:      firstEpoch,
		epochStart: now,
		lastEnd:    now,
		unready:    make(map[int32]struct{}),
	}
}

// Epoch returns the current epoch number.
func (c *Coordinator) Epoch() uint64 { return c.epoch }

// Phase returns where the coordinator is in the protocol.
func (c *Coordinator) Phase() Phase { return c.phase }

// Done reports whether the instance has wound down after RequestShutdown:
// the final checkpoint completed (or aborted, or there was nothing to
// commit). Nothing processed before the shutdown request is left
// uncommitted except what an abort rewound.
func (c *Coordinator) Done() bool { return c.phase == Done }

// ConsecutiveFailures returns how many checkpoints failed since the last
// one that was applied.
func (c *Coordinator) ConsecutiveFailures() int { return c.failures }

// Tasks returns the current task set, ascending.
func (c *Coordinator) Tasks() []int32 { return slices.Clone(c.tasks) }

// Tick tells the coordinator the time. While processing it ends the epoch
// if it is due (ReasonInterval): it has work, Interval has passed since it
// began and MinPause since the last checkpoint ended. During alignment or
// commit it fails a checkpoint older than Timeout (ActAbort with
// ReasonTimeout, or ActFail past TolerableFailures). Only Tick detects
// timeouts: a TaskReady or CommitDone that arrives late but before the Tick
// that would time it out is accepted, since the work it reports is done.
func (c *Coordinator) Tick(now time.Time) Action {
	switch c.phase {
	case Processing:
		return c.endIfDue(now)
	case Aligning, Committing:
		if elapsed := now.Sub(c.ckptStart); elapsed > c.cfg.Timeout {
			cause := fmt.Errorf("%w: %s after %v (limit %v)", ErrTimeout, c.phase, elapsed, c.cfg.Timeout)
			if c.phase == Aligning {
				cause = fmt.Errorf("%w; tasks not ready: %s", cause, formatTasks(c.unreadyTasks()))
			}
			return c.failEpoch(ReasonTimeout, cause)
		}
	case Failed:
		return c.failed()
	}
	return Action{}
}

// Work reports that a record was processed. While processing it marks the
// current epoch as having work, and ends it if that makes it due (see Tick):
// after an idle stretch longer than Interval the first record does not wait
// for the next Tick. During alignment the record is one queued before the
// barrier and belongs to the ending epoch. During commit and apply it
// belongs to the next epoch (processing overlapped with the commit). During
// an abort, or with no tasks, no record may be processed: that is an
// illegal event.
func (c *Coordinator) Work(now time.Time) Action {
	switch c.phase {
	case Failed:
		return c.failed()
	case Aborting, Done:
		return c.illegal("Work", "records processed now would escape every checkpoint")
	}
	if len(c.tasks) == 0 {
		return c.illegal("Work", "no task is assigned, so no record can have been processed")
	}
	switch c.phase {
	case Processing:
		c.hasWork = true
		return c.endIfDue(now)
	case Committing, Applying:
		c.nextWork = true
	}
	return Action{}
}

// SetTasks replaces the instance's task set (the partition numbers it owns),
// for the next barrier. Only between checkpoints (Processing), and a task
// may be dropped only while the current epoch has no work: its outputs are
// in the open transaction, and committing them without its marker and
// offsets would duplicate them. So drop tasks right after a revocation
// completed (RequestRevoke) or after an abort; add them any time. Negative
// or repeated task numbers are illegal.
func (c *Coordinator) SetTasks(tasks []int32) Action {
	switch c.phase {
	case Processing:
	case Failed:
		return c.failed()
	default:
		return c.illegal("SetTasks", "the task set may change only between checkpoints")
	}
	next := slices.Clone(tasks)
	slices.Sort(next)
	for i, t := range next {
		if t < 0 {
			return c.illegal("SetTasks", fmt.Sprintf("task %d is negative", t))
		}
		if i > 0 && next[i-1] == t {
			return c.illegal("SetTasks", fmt.Sprintf("task %d is listed twice", t))
		}
	}
	if c.hasWork {
		for _, t := range c.tasks {
			if _, found := slices.BinarySearch(next, t); !found {
				return c.illegal("SetTasks", fmt.Sprintf(
					"task %d dropped while the epoch has work: end the epoch first (RequestRevoke) or abort it (EpochFailed)", t))
			}
		}
	}
	c.tasks = next
	return Action{}
}

// RequestSavepoint ends the epoch now with ReasonSavepoint, whatever the
// interval, MinPause or work: a savepoint is taken even of an idle
// instance. During a checkpoint the request waits and its checkpoint starts
// as soon as the one in flight ends. Requests that wait together are served
// by one savepoint. The engine writes the savepoint at the ActApply that
// carries ReasonSavepoint; a savepoint checkpoint that fails is not retried
// (see CheckpointError.Trigger). After Done there is no checkpoint to take:
// illegal.
func (c *Coordinator) RequestSavepoint(now time.Time) Action {
	switch c.phase {
	case Processing:
		return c.endEpoch(ReasonSavepoint, now)
	case Aligning, Committing, Applying, Aborting:
		c.savepointPending = true
		return Action{}
	case Failed:
		return c.failed()
	}
	return c.illegal("RequestSavepoint", "the final checkpoint is already done")
}

// RequestShutdown asks for the final checkpoint: the epoch ends now with
// ReasonShutdown, whatever the interval or MinPause, and once it is applied
// Done reports true. An epoch without work is not committed: Done at once.
// During a checkpoint the request waits for it; records processed in
// between (overlap) get a final checkpoint of their own. A final checkpoint
// that fails is not retried: after Aborted the instance is Done with its
// input rewound, and a restart processes it again. A pending savepoint is
// taken first. Repeated requests are no-ops.
func (c *Coordinator) RequestShutdown(now time.Time) Action {
	switch c.phase {
	case Processing:
		c.shutdown = true
		return c.resume(now)
	case Aligning, Committing, Applying, Aborting:
		c.shutdown = true
		return Action{}
	case Failed:
		return c.failed()
	}
	return Action{}
}

// RequestRevoke asks to commit everything processed so far before the
// instance gives partitions up: the epoch ends now with ReasonRevoke,
// whatever the interval or MinPause, if it has work; without work there is
// nothing to commit and it returns ActNone. During a checkpoint the request
// waits for it. The revocation is complete, and the engine may release the
// partitions and then SetTasks without them, as soon as Phase is Processing
// (or Done) again after the request: every record processed before it is
// then committed or rewound.
func (c *Coordinator) RequestRevoke(now time.Time) Action {
	switch c.phase {
	case Processing:
		c.revoke = true
		return c.resume(now)
	case Aligning, Committing, Applying, Aborting:
		c.revoke = true
		return Action{}
	case Failed:
		return c.failed()
	}
	return Action{}
}

// RequestCheckpoint ends the epoch now with ReasonBudget if it has work,
// whatever the interval or MinPause: the engine asks for it when the epoch's
// write-set reached its size budget, so that one epoch's state changes (held
// in memory until the commit, and replayed whole by a restore) stay bounded.
// Outside Processing it does nothing: records processed during a checkpoint
// belong to the next epoch, whose own budget asks again.
func (c *Coordinator) RequestCheckpoint(now time.Time) Action {
	switch {
	case c.phase == Failed:
		return c.failed()
	case c.phase != Processing || !c.hasWork:
		return Action{}
	}
	return c.endEpoch(ReasonBudget, now)
}

// TaskReady reports that task drained the records queued before the barrier
// and handed over its write-set and next offsets. When every task named in
// ActEndEpoch is ready it returns ActCommit: the changelog and markers are
// produced and flushed only now, once every task stopped at the barrier,
// and EndTxn only after them (see ActCommit). A task that was not asked, or
// that reports twice, is illegal.
func (c *Coordinator) TaskReady(task int32, now time.Time) Action {
	switch c.phase {
	case Aligning:
	case Failed:
		return c.failed()
	default:
		return c.illegal("TaskReady", fmt.Sprintf("task %d reported ready outside alignment", task))
	}
	if _, waiting := c.unready[task]; !waiting {
		if _, asked := slices.BinarySearch(c.ckptTasks, task); asked {
			return c.illegal("TaskReady", fmt.Sprintf("task %d reported ready twice", task))
		}
		return c.illegal("TaskReady", fmt.Sprintf("task %d was not asked to hand over (asked: %s)", task, formatTasks(c.ckptTasks)))
	}
	delete(c.unready, task)
	if len(c.unready) > 0 {
		return Action{}
	}
	c.phase = Committing
	return c.checkpointAction(ActCommit)
}

// CommitDone reports that the epoch's transaction committed (EndTxn
// succeeded, with every changelog record and marker flushed before it). It
// returns ActApply: this is the only way to it, so no backend is ever
// advanced before its epoch is committed in Kafka.
func (c *Coordinator) CommitDone(now time.Time) Action {
	switch c.phase {
	case Committing:
		c.phase = Applying
		return c.checkpointAction(ActApply)
	case Failed:
		return c.failed()
	}
	return c.illegal("CommitDone", "no commit was asked for")
}

// CommitFailed reports that pre-commit or commit of the epoch failed
// (changelog produce or flush, TxnOffsetCommit, EndTxn; fenced or lost
// partitions). It returns ActAbort, or ActFail when the consecutive
// failures exceed TolerableFailures. err must not be nil.
func (c *Coordinator) CommitFailed(err error, now time.Time) Action {
	switch c.phase {
	case Committing:
		if err == nil {
			return c.illegal("CommitFailed", "nil error")
		}
		return c.failEpoch(ReasonCommitFailed, err)
	case Failed:
		return c.failed()
	}
	return c.illegal("CommitFailed", "no commit was asked for")
}

// CommitRefused reports that the commit failed because of one of the
// epoch's inputs, which its replay handles differently (an output the broker
// will never accept: the replay isolates or dead-letters its input). It is
// answered with ActAbort (ReasonReplay) like CommitFailed, but it does not
// count against TolerableFailures: restarting the session would only lose
// what was learned. The engine must make every such replay progress (end it
// where the refused attempt ended), or it could abort forever. err must not
// be nil.
func (c *Coordinator) CommitRefused(err error, now time.Time) Action {
	switch c.phase {
	case Committing:
		if err == nil {
			return c.illegal("CommitRefused", "nil error")
		}
		c.phase = Aborting
		ckptErr := &CheckpointError{Epoch: c.epoch, Trigger: c.ckptReason, Reason: ReasonReplay, Cause: err}
		return Action{Kind: ActAbort, Epoch: c.epoch, Tasks: slices.Clone(c.tasks), Reason: ReasonReplay, Err: ckptErr}
	case Failed:
		return c.failed()
	}
	return c.illegal("CommitRefused", "no commit was asked for")
}

// EpochFailed reports that the current epoch cannot be committed for a
// reason found outside the commit: a task failed to process or hand over,
// partitions were lost, the producer was fenced or an output produce
// failed. It is accepted while processing, aligning and committing, and is
// handled like a failed checkpoint (ReasonEpochFailed): ActAbort, or
// ActFail past TolerableFailures. err must not be nil.
func (c *Coordinator) EpochFailed(err error, now time.Time) Action {
	switch c.phase {
	case Processing, Aligning, Committing:
		if err == nil {
			return c.illegal("EpochFailed", "nil error")
		}
		return c.failEpoch(ReasonEpochFailed, err)
	case Failed:
		return c.failed()
	}
	return c.illegal("EpochFailed", "no epoch can fail now")
}

// Applied reports that every task applied the epoch: its backend holds it,
// or is being written with it behind the next epoch's processing (the
// engine's apply, whose failure ends the instance rather than the
// checkpoint). The checkpoint is complete: the epoch number advances, the consecutive
// failures reset, and the next epoch (begun at this checkpoint's barrier)
// goes on. Waiting requests are served now, and the next epoch ends at
// once if it is already due.
func (c *Coordinator) Applied(now time.Time) Action {
	switch c.phase {
	case Applying:
	case Failed:
		return c.failed()
	default:
		return c.illegal("Applied", "no apply was asked for")
	}
	c.epoch++
	c.failures = 0
	c.phase = Processing
	c.epochStart = c.ckptStart
	c.lastEnd = now
	c.hasWork = c.nextWork
	c.nextWork = false
	return c.resume(now)
}

// ApplyFailed reports that applying a committed epoch to a backend failed.
// The commit cannot be taken back and the backend is behind the changelog,
// so the only way on is a restart that restores from the changelog: it
// returns ActFail (ReasonApplyFailed, ErrApplyFailed), never tolerated. err
// must not be nil.
func (c *Coordinator) ApplyFailed(err error, now time.Time) Action {
	switch c.phase {
	case Applying:
		if err == nil {
			return c.illegal("ApplyFailed", "nil error")
		}
		return c.fail(ReasonApplyFailed, fmt.Errorf("%w: epoch %d: %w", ErrApplyFailed, c.epoch, err))
	case Failed:
		return c.failed()
	}
	return c.illegal("ApplyFailed", "no apply was asked for")
}

// Aborted reports that the abort finished: transaction aborted, write-sets
// dropped, tasks rewound. The same epoch number starts again (nothing of it
// committed), with no work, begun now. Waiting requests are served now.
func (c *Coordinator) Aborted(now time.Time) Action {
	switch c.phase {
	case Aborting:
	case Failed:
		return c.failed()
	default:
		return c.illegal("Aborted", "no abort was asked for")
	}
	c.phase = Processing
	c.epochStart = now
	c.lastEnd = now
	c.hasWork = false
	c.nextWork = false
	return c.resume(now)
}

// resume runs in Processing when nothing is in flight: it serves waiting
// requests in order of precedence, then ends the epoch if it is due.
func (c *Coordinator) resume(now time.Time) Action {
	switch {
	case c.savepointPending:
		return c.endEpoch(ReasonSavepoint, now)
	case c.shutdown && c.hasWork:
		return c.endEpoch(ReasonShutdown, now)
	case c.shutdown:
		c.phase = Done
		return Action{}
	case c.revoke && c.hasWork:
		return c.endEpoch(ReasonRevoke, now)
	}
	c.revoke = false
	return c.endIfDue(now)
}

// Due returns when the current epoch becomes due, the earliest time at
// which Tick would place its barrier for the interval, and whether there is
// such a time: only while Processing an epoch that has work. A caller that
// waits (for records) between events must not wait past it, or the epoch
// ends late by the rest of the wait.
func (c *Coordinator) Due() (time.Time, bool) {
	if c.phase != Processing || !c.hasWork {
		return time.Time{}, false
	}
	due := c.epochStart.Add(c.cfg.Interval)
	if pause := c.lastEnd.Add(c.cfg.MinPause); pause.After(due) {
		due = pause
	}
	return due, true
}

func (c *Coordinator) endIfDue(now time.Time) Action {
	if !c.hasWork || now.Sub(c.epochStart) < c.cfg.Interval || now.Sub(c.lastEnd) < c.cfg.MinPause {
		return Action{}
	}
	return c.endEpoch(ReasonInterval, now)
}

// endEpoch places the barrier: the current epoch ends, the next begins.
func (c *Coordinator) endEpoch(reason Reason, now time.Time) Action {
	if c.epoch == math.MaxUint64 {
		return c.fail(ReasonEpochOverflow, fmt.Errorf("%w: epoch %d cannot end", ErrEpochOverflow, c.epoch))
	}
	c.ckptTasks = slices.Clone(c.tasks)
	clear(c.unready)
	for _, t := range c.ckptTasks {
		c.unready[t] = struct{}{}
	}
	c.ckptStart = now
	c.ckptReason = reason
	c.hasWork = false
	c.nextWork = false
	if reason == ReasonSavepoint {
		c.savepointPending = false
	}
	if len(c.ckptTasks) == 0 {
		c.phase = Committing
		return c.checkpointAction(ActCommit)
	}
	c.phase = Aligning
	return c.checkpointAction(ActEndEpoch)
}

func (c *Coordinator) checkpointAction(kind ActionKind) Action {
	return Action{Kind: kind, Epoch: c.epoch, Tasks: slices.Clone(c.ckptTasks), Reason: c.ckptReason}
}

// failEpoch fails the current epoch, in flight or not: ActAbort, or ActFail
// once the consecutive failures exceed TolerableFailures.
func (c *Coordinator) failEpoch(reason Reason, cause error) Action {
	trigger := c.ckptReason
	if c.phase == Processing {
		trigger = ReasonNone
	}
	ckptErr := &CheckpointError{Epoch: c.epoch, Trigger: trigger, Reason: reason, Cause: cause}
	c.failures++
	if c.failures > c.cfg.TolerableFailures {
		return c.fail(reason, fmt.Errorf("%w (%d, tolerated %d): %w",
			ErrTooManyFailures, c.failures, c.cfg.TolerableFailures, ckptErr))
	}
	c.phase = Aborting
	return Action{Kind: ActAbort, Epoch: c.epoch, Tasks: slices.Clone(c.tasks), Reason: reason, Err: ckptErr}
}

func (c *Coordinator) illegal(event, detail string) Action {
	return c.fail(ReasonIllegalEvent, &EventError{Event: event, Phase: c.phase, Epoch: c.epoch, Detail: detail})
}

func (c *Coordinator) fail(reason Reason, err error) Action {
	c.phase = Failed
	c.failReason = reason
	c.failErr = err
	return c.failed()
}

// failed is the answer to every event once Failed: the first failure, again.
func (c *Coordinator) failed() Action {
	return Action{Kind: ActFail, Epoch: c.epoch, Reason: c.failReason, Err: c.failErr}
}

func (c *Coordinator) unreadyTasks() []int32 {
	var tasks []int32
	for _, t := range c.ckptTasks {
		if _, ok := c.unready[t]; ok {
			tasks = append(tasks, t)
		}
	}
	return tasks
}

// Err returns why the coordinator failed, or nil.
func (c *Coordinator) Err() error { return c.failErr }
