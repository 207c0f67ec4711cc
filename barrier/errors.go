package barrier

import (
	"errors"
	"fmt"
)

// Sentinels, each matched with errors.Is against an Action's Err.
var (
	// ErrIllegalEvent is in the Err of the ActFail returned for an event that
	// the current phase does not allow: CommitDone while processing,
	// TaskReady for a task that was not asked, SetTasks during a checkpoint
	// and the like. It always comes wrapped in an *EventError. The caller has
	// a bug that threatens exactly-once, so it is never ignored.
	ErrIllegalEvent = errors.New("barrier: illegal event")

	// ErrTimeout is the Cause of the *CheckpointError of a checkpoint that
	// took longer than Config.Timeout from its barrier.
	ErrTimeout = errors.New("barrier: checkpoint timed out")

	// ErrTooManyFailures is in the Err of the ActFail returned when a failed
	// checkpoint makes the consecutive failures exceed
	// Config.TolerableFailures. The same Err also wraps the
	// *CheckpointError of the failure that tipped it.
	ErrTooManyFailures = errors.New("barrier: too many consecutive failed checkpoints")

	// ErrApplyFailed is in the Err of the ActFail returned by ApplyFailed.
	// Applying follows a commit that cannot be taken back, so it is never
	// retried in-process: a restart restores the task from the changelog.
	ErrApplyFailed = errors.New("barrier: applying a committed epoch failed")

	// ErrEpochOverflow is in the Err of the ActFail returned when epoch
	// math.MaxUint64 would end: its successor has no number.
	ErrEpochOverflow = errors.New("barrier: epoch numbers exhausted")
)

// EventError describes an event that arrived in a phase that does not allow
// it. It unwraps to ErrIllegalEvent.
type EventError struct {
	Event  string // the Coordinator method, e.g. "CommitDone"
	Phase  Phase  // the phase it arrived in
	Epoch  uint64 // the current epoch then
	Detail string // what was wrong
}

func (e *EventError) Error() string {
	return fmt.Sprintf("barrier: illegal event %s while %s in epoch %d: %s", e.Event, e.Phase, e.Epoch, e.Detail)
}

// Unwrap returns ErrIllegalEvent.
func (e *EventError) Unwrap() error { return ErrIllegalEvent }

// CheckpointError describes a failed epoch: the Err of every ActAbort, and
// wrapped in the Err of an ActFail for too many failures.
type CheckpointError struct {
	Epoch uint64
	// Trigger is why the epoch was ending (ReasonInterval, ReasonSavepoint,
	// ...), or ReasonNone when it failed before its barrier (EpochFailed
	// while processing). A savepoint whose checkpoint failed is not retried;
	// Trigger == ReasonSavepoint tells the engine to report that to whoever
	// asked.
	Trigger Reason
	// Reason is how it failed: ReasonTimeout, ReasonCommitFailed or
	// ReasonEpochFailed.
	Reason Reason
	// Cause is the error the caller reported, or ErrTimeout.
	Cause error
}

func (e *CheckpointError) Error() string {
	if e.Trigger == ReasonNone {
		return fmt.Sprintf("barrier: epoch %d failed before its barrier (%s): %v", e.Epoch, e.Reason, e.Cause)
	}
	return fmt.Sprintf("barrier: checkpoint of epoch %d (%s) failed (%s): %v", e.Epoch, e.Trigger, e.Reason, e.Cause)
}

// Unwrap returns Cause.
func (e *CheckpointError) Unwrap() error { return e.Cause }
