package barrier

import (
	"fmt"
	"strconv"
	"strings"
)

// ActionKind is what the caller must do next. The order in which the kinds
// arrive is the checkpoint protocol (DESIGN.md §3); each kind's doc says what
// must be done and what must not be done before reporting back.
type ActionKind int

const (
	// ActNone: nothing to do; keep processing.
	ActNone ActionKind = iota

	// ActEndEpoch is the barrier that ends Epoch. Stop dispatching records.
	// Each task in Tasks finishes the records queued before the barrier
	// (they still belong to Epoch: report them with Work as usual), then
	// hands over its write-set and next input offsets and is reported with
	// TaskReady. Records fetched after the barrier belong to the next epoch
	// and must wait at least until ActCommit.
	ActEndEpoch

	// ActCommit: every task in Tasks has handed over; pre-commit and commit
	// Epoch, in this order:
	//
	//  1. per task, produce one changelog record per dirty key (value or
	//     tombstone) and then the epoch marker (Epoch, next input offsets)
	//     to changelog partition Task, inside the open transaction;
	//  2. flush: the changelog records and markers must be acknowledged
	//     before EndTxn, so that a committed transaction always holds the
	//     marker that tells restore where Epoch ends and where input
	//     resumes;
	//  3. TxnOffsetCommit with the group metadata, then EndTxn(commit).
	//
	// Report CommitDone only once EndTxn succeeded, CommitFailed on any
	// error. Do not touch the backends: nothing local may change before the
	// commit is known. Records of the next epoch may be processed while this
	// runs (report them with Work) if their outputs are held until the next
	// transaction opens.
	//
	// ActCommit without a preceding ActEndEpoch means the instance has no
	// tasks: there is nothing to align, only the (empty) commit.
	ActCommit

	// ActApply: Epoch is committed in Kafka. Apply each task's write-set to
	// its backend together with its meta (epoch, input offsets, changelog
	// offset just past its marker) in one backend transaction, then report
	// Applied (or ApplyFailed). If Reason is ReasonSavepoint, write the
	// savepoint after applying and before Applied, so it shows exactly
	// Epoch. This comes only after CommitDone, never before: local state is
	// never wiped on restart, so a backend that got ahead of Kafka could
	// never be brought back.
	ActApply

	// ActAbort: Epoch failed. Abort the transaction, drop every write-set
	// (of Epoch and of anything processed since its barrier), rewind every
	// task in Tasks to its committed input offsets, then report Aborted. The
	// backends are untouched: nothing local changed, so nothing needs
	// repair. Reason and Err (a *CheckpointError) say why.
	//
	// An abort that follows ActCommit (timeout or commit error) may race an
	// EndTxn whose outcome is unknown. Rewinding to offsets read back from
	// the group (KIP-447 require-stable) and replaying the changelog past
	// each backend's stored offset is correct either way, exactly as after
	// a crash between EndTxn and apply. Never report the late outcome of
	// the aborted attempt (CommitDone after ActAbort is an illegal event).
	ActAbort

	// ActFail: stop the instance. Commit nothing more, apply nothing more,
	// and exit so that a restart restores from Kafka; an open transaction
	// is aborted when the restarted producer fences it, or by the
	// transaction timeout. Err says why; the Coordinator is Failed and
	// every later event returns the same ActFail.
	ActFail
)

var actionKindNames = [...]string{
	ActNone:     "none",
	ActEndEpoch: "end-epoch",
	ActCommit:   "commit",
	ActApply:    "apply",
	ActAbort:    "abort",
	ActFail:     "fail",
}

func (k ActionKind) String() string {
	if k >= 0 && int(k) < len(actionKindNames) {
		return actionKindNames[k]
	}
	return "ActionKind(" + strconv.Itoa(int(k)) + ")"
}

// Reason says why an epoch ended or failed.
type Reason int

const (
	// ReasonNone: no reason, as on ActNone, or the Trigger of an epoch that
	// failed before its barrier.
	ReasonNone Reason = iota

	// Why an epoch ended (ActEndEpoch, carried on to ActCommit and
	// ActApply).
	ReasonInterval  // Config.Interval elapsed and the epoch had work
	ReasonSavepoint // RequestSavepoint
	ReasonShutdown  // RequestShutdown: the final checkpoint
	ReasonRevoke    // RequestRevoke: commit before giving partitions up

	// Why an epoch failed (ActAbort, ActFail).
	ReasonTimeout       // the checkpoint outlived Config.Timeout
	ReasonCommitFailed  // CommitFailed
	ReasonEpochFailed   // EpochFailed
	ReasonApplyFailed   // ApplyFailed
	ReasonIllegalEvent  // an event the phase does not allow
	ReasonEpochOverflow // epoch math.MaxUint64 would end

	// ReasonBudget: RequestCheckpoint, the epoch's write-set reached its
	// size budget (an epoch end, listed last to keep the numbers above).
	ReasonBudget
	// ReasonReplay: CommitRefused, the epoch must be replayed with an input
	// handled differently (a failure, not counted as one).
	ReasonReplay
)

var reasonNames = [...]string{
	ReasonNone:          "none",
	ReasonInterval:      "interval",
	ReasonSavepoint:     "savepoint",
	ReasonShutdown:      "shutdown",
	ReasonRevoke:        "revoke",
	ReasonTimeout:       "timeout",
	ReasonCommitFailed:  "commit-failed",
	ReasonEpochFailed:   "epoch-failed",
	ReasonApplyFailed:   "apply-failed",
	ReasonIllegalEvent:  "illegal-event",
	ReasonEpochOverflow: "epoch-overflow",
	ReasonBudget:        "budget",
	ReasonReplay:        "replay",
}

func (r Reason) String() string {
	if r >= 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Action is what the caller must do next, returned by every event.
type Action struct {
	Kind  ActionKind
	Epoch uint64 // the epoch it concerns; for ActFail the current epoch

	// Tasks are the tasks concerned, in ascending order: for ActEndEpoch
	// the tasks that must hand over, for ActCommit and ActApply the tasks
	// whose write-sets and markers make up the epoch, for ActAbort the
	// tasks to rewind. The slice is the caller's to keep.
	Tasks []int32

	// Reason is why the epoch ended (ActEndEpoch, ActCommit, ActApply) or
	// failed (ActAbort, ActFail).
	Reason Reason

	// Err is set for ActAbort (a *CheckpointError) and ActFail.
	Err error
}

// String renders the action on one line for logs, e.g.
// "end-epoch epoch=7 tasks=0,3 reason=interval".
func (a Action) String() string {
	if a.Kind == ActNone {
		return a.Kind.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s epoch=%d", a.Kind, a.Epoch)
	if a.Kind != ActFail {
		b.WriteString(" tasks=")
		b.WriteString(formatTasks(a.Tasks))
	}
	if a.Reason != ReasonNone {
		fmt.Fprintf(&b, " reason=%s", a.Reason)
	}
	if a.Err != nil {
		fmt.Fprintf(&b, " err=%q", a.Err.Error())
	}
	return b.String()
}

// formatTasks renders tasks as "0,3,7", or "-" for none.
func formatTasks(tasks []int32) string {
	if len(tasks) == 0 {
		return "-"
	}
	parts := make([]string, len(tasks))
	for i, t := range tasks {
		parts[i] = strconv.Itoa(int(t))
	}
	return strings.Join(parts, ",")
}
