package barrier

import (
	"errors"
	"fmt"
	"time"
)

// Config sets the checkpoint cadence and failure tolerance of one
// Coordinator. It has no defaults of its own: the engine fills every field
// (its documented defaults live with the engine's options) and calls
// Validate before New.
type Config struct {
	// Interval is the epoch length: an epoch that has work ends once this
	// long has passed since it began. An epoch begins at the barrier that
	// ended the one before it (so, as in Flink, Interval is the distance
	// between the starts of two checkpoints, not the pause between them),
	// at the end of an abort, or at New. An epoch without work is never
	// committed on interval: it keeps going, and the first record it gets
	// after its interval has passed ends it at the next Tick or Work.
	// Must be positive.
	Interval time.Duration

	// Timeout bounds one checkpoint, from its barrier (ActEndEpoch) to
	// CommitDone. A Tick that finds a checkpoint older than this fails it
	// (ActAbort with ReasonTimeout, counted like any failed checkpoint).
	// Applying is not bounded: the transaction is committed by then and
	// cannot be taken back. Must be positive.
	Timeout time.Duration

	// MinPause is the least time between the end of one checkpoint
	// (Applied or Aborted) and the barrier of the next interval checkpoint,
	// Flink's min pause between checkpoints: when checkpoints take longer
	// than Interval it keeps the instance from doing nothing but commit.
	// Savepoints, shutdowns and revocations ignore it. Zero disables it.
	MinPause time.Duration

	// TolerableFailures is how many consecutive failed checkpoints are
	// tolerated, as Flink's tolerable-failed-checkpoints: a failure that
	// makes the count exceed it returns ActFail instead of ActAbort. 0
	// tolerates none (the first failure is fatal, Flink's default); the
	// engine defaults to 3. A successful checkpoint (Applied) resets the
	// count. Must not be negative.
	TolerableFailures int
}

// Validate reports every field that is out of bounds, each naming the field,
// its value and the rule it breaks.
func (c Config) Validate() error {
	checks := []struct {
		field string
		value any
		bad   bool
		rule  string
	}{
		{"Interval", c.Interval, c.Interval <= 0, "must be positive: it is the epoch length"},
		{"Timeout", c.Timeout, c.Timeout <= 0, "must be positive: a checkpoint that can never time out can hang the instance"},
		{"MinPause", c.MinPause, c.MinPause < 0, "must not be negative (0 disables the pause)"},
		{"TolerableFailures", c.TolerableFailures, c.TolerableFailures < 0, "must not be negative (0 tolerates no failed checkpoint)"},
	}
	var errs []error
	for _, ch := range checks {
		if ch.bad {
			errs = append(errs, fmt.Errorf("barrier: Config.%s is %v; it %s", ch.field, ch.value, ch.rule))
		}
	}
	return errors.Join(errs...)
}
