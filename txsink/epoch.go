package txsink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// EpochSink is an outside system that joins the epoch's transaction by two
// phases: each task's rows of an epoch are written and made durable but not
// visible (PreCommit) before the Kafka transaction ends, made visible
// (Commit) once it committed, and thrown away (Abort) if it aborted. Kafka's
// commit decides: the epoch's marker names the sink transaction (its
// TxnID), and whoever restores the task finishes what the marker says
// (Recover).
//
// Ordering rules, which the engine keeps (loop.go, sink.go):
//
//  1. PreCommit of every task runs after every Kafka record of the epoch
//     (outputs, changelog, the markers naming the sink transactions) is
//     acknowledged, and before EndTxn. So a prepared sink transaction
//     always belongs to a Kafka transaction whose marker is already in the
//     changelog, open or ended.
//  2. EndTxn is sent only if every task's PreCommit succeeded; a failed
//     PreCommit aborts the epoch (nothing of it was prepared for that task,
//     and the others are aborted).
//  3. Commit runs only after EndTxn committed; Abort only after it
//     aborted. An unknown outcome (EndTxn failed) runs neither: the restore
//     decides.
//  4. A task's next EndTxn does not proceed while a commit of its earlier
//     epoch is pending (a Commit that failed is retried first): so when a
//     task's marker of epoch E+1 is committed, epoch E's rows are visible.
//  5. Every restore of a task begins with a Claim (before the changelog is
//     read) and ends with Recover(claim, the last marker's TxnID): that
//     transaction is committed if it is still prepared; every other
//     prepared transaction of the task that was prepared before the claim
//     is rolled back. Rule 1 makes "prepared before the claim" mean "its
//     Kafka transaction's marker was durable before the restore read the
//     changelog", so the restore has seen that transaction's outcome: it
//     committed (then it is the last marker's, or an older one already
//     committed by rule 4) or it never will. A transaction prepared after
//     the claim is left alone: it may be a newer owner's whose Kafka epoch
//     commits, which a paused older owner must not roll back.
//  6. The task runs only once Recover succeeded.
//
// Every method may be called from any goroutine; PreCommit of different
// tasks runs in parallel.
type EpochSink interface {
	// Setup connects and checks the sink, creating what it needs if
	// missing. An error wrapping ErrSinkSetup is final (a table of another
	// shape, a server that refuses prepared transactions); any other is
	// retried (the database is not up yet).
	Setup(ctx context.Context) error
	// Check validates a row as a job writes it, without I/O: a row the
	// sink could never write fails its record (it goes to the dead-letter
	// topic) instead of failing every epoch at PreCommit.
	Check(row []any) error
	// Begin starts a task's rows for one epoch, in memory.
	Begin(task int32) EpochTxn
	// Claim starts a restore of the task (rule 5): it reads the sink's
	// clock. The engine bounds ctx by its checkpoint timeout; a restore
	// whose Claim or Recover fails is tried again from a new Claim.
	Claim(ctx context.Context, task int32) (Claim, error)
	// Recover ends the restore that made the claim: committed is the
	// last marker's sink transaction ("" if it names none). It may be
	// cut short by ctx, so what it did must hold when it is called again
	// after a new Claim.
	Recover(ctx context.Context, c Claim, committed string) error
	// Commit makes a prepared transaction visible. Committing one that is
	// already committed succeeds; one that is neither prepared nor
	// committed is ErrSinkConflict.
	Commit(ctx context.Context, id TxnID) error
	// Abort rolls a prepared transaction back; one that is not prepared
	// (never was, or already rolled back) is not an error.
	Abort(ctx context.Context, id TxnID) error
	// Close releases the sink's connections.
	Close()
}

// EpochTxn is one task's rows of one epoch.
type EpochTxn interface {
	// Write adds a row that Check accepted; no I/O.
	Write(row []any)
	// Len is the number of rows PreCommit will write (after merging rows
	// of the same key, for a sink that upserts).
	Len() int
	// PreCommit writes the rows in a sink transaction of their own and
	// prepares it under id: durable, not visible. On error nothing stays
	// prepared under id, unless the error is one whose outcome is not
	// known (a lost connection during PREPARE); Recover or Abort settles
	// that one.
	PreCommit(ctx context.Context, id TxnID) error
}

// Claim is a restore's claim on a task (rule 5).
type Claim struct {
	Task int32
	// At is the sink's clock when the claim was taken: transactions of
	// the task prepared before it are the restore's to settle.
	At time.Time
}

// TxnID names a task's sink transaction of an epoch. Nonce tells apart the
// attempts of an epoch (an aborted epoch is tried again under the same
// number, possibly while the aborted attempt is still prepared because its
// rollback failed).
type TxnID struct {
	App   string
	Task  int32
	Epoch uint64
	Nonce string
}

// The sink errors that stop the instance: retrying cannot help, and going
// on would fail every epoch or lose rows.
var (
	// ErrSinkSetup: the sink cannot be used as configured; its message
	// says what to change.
	ErrSinkSetup = errors.New("txsink: sink setup")
	// ErrSinkRefused: the sink refuses a row for good (a value out of
	// range, a constraint): Check did not catch it.
	ErrSinkRefused = errors.New("txsink: the sink refused the epoch's rows")
	// ErrSinkConflict: the sink holds something the Kafka side says cannot
	// be: the epoch is already applied, or the prepared transaction of a
	// committed epoch is gone. Another app with the same id writing to the
	// same database, or an operator's hand.
	ErrSinkConflict = errors.New("txsink: the sink's epochs disagree with Kafka's")
)

// String is the transaction's global id, sluice/<app>/<task>/<epoch>/<nonce>,
// with the app id path-escaped so that a '/' in it cannot make one task's
// prefix another's.
func (id TxnID) String() string {
	return fmt.Sprintf("%s%d/%s", TaskPrefix(id.App, id.Task), id.Epoch, id.Nonce)
}

// TaskPrefix is the prefix of every transaction id of an app's task.
func TaskPrefix(app string, task int32) string {
	return "sluice/" + url.PathEscape(app) + "/" + strconv.Itoa(int(task)) + "/"
}

// ParseTxnID reads a String back.
func ParseTxnID(s string) (TxnID, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 5 || parts[0] != "sluice" {
		return TxnID{}, fmt.Errorf("txsink: %q is not a sink transaction id", s)
	}
	app, err := url.PathUnescape(parts[1])
	if err != nil {
		return TxnID{}, fmt.Errorf("txsink: %q: app: %w", s, err)
	}
	task, err := strconv.ParseInt(parts[2], 10, 32)
	if err != nil {
		return TxnID{}, fmt.Errorf("txsink: %q: task: %w", s, err)
	}
	epoch, err := strconv.ParseUint(parts[3], 10, 64)
	if err != nil {
		return TxnID{}, fmt.Errorf("txsink: %q: epoch: %w", s, err)
	}
	return TxnID{App: app, Task: int32(task), Epoch: epoch, Nonce: parts[4]}, nil
}
