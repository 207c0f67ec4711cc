package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/kstate"
)

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Record is one input record, as read from an input topic.
type Record struct {
	Key       []byte
	Value     []byte
	Headers   []Header
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
}

// Context is what a Processor gets for each record. Keyed state read or
// written through it (it is a kstate.Scope) is scoped to the record's key.
// Emitted records join the epoch's transaction; they are produced only if
// the record's processing returns nil.
//
// A Context is valid only during the call it was passed to.
type Context interface {
	kstate.Scope

	// Context is cancelled when the instance shuts down.
	Context() context.Context
	// Task is the task (input partition number) processing the record.
	Task() int32
	// OutputTopic is the job's output topic.
	OutputTopic() string
	// Emit sends a record to the job's output topic, partitioned by key
	// with Kafka's default murmur2 partitioner, its Kafka timestamp
	// Timestamp (sluice.WithTimestamp sets another; a time Kafka cannot
	// carry gives the processing time), as for EmitTo, EmitToPartition
	// and Output. The record keeps key,
	// value and the headers' bytes until its produce is acknowledged (by
	// the epoch's commit at the latest): do not modify or reuse them after
	// the call. The same holds for EmitTo, EmitToPartition and Output.
	Emit(key, value []byte, headers ...Header)
	// EmitTo sends a record to another topic, partitioned by key with
	// murmur2. The topic must exist: Sluice creates only the topics its
	// options name. Until it does, every epoch with a record to it
	// aborts and is replayed, the instance logs the topic at error level,
	// and Instance.Ready is false.
	EmitTo(topic string, key, value []byte, headers ...Header)
	// EmitToPartition sends a record to an explicit partition of topic,
	// which must exist, as for EmitTo.
	EmitToPartition(topic string, partition int32, key, value []byte, headers ...Header)
	// Output sends a record to the side output tag, which the job declares
	// in Job.SideOutputs and the configuration binds to a topic
	// (Options.SideOutputTopics); partitioned by key with murmur2. It joins
	// the epoch's transaction like Emit.
	Output(tag OutputTag, key, value []byte, headers ...Header)

	// Timestamp is the event time of what is being handled: in Process the
	// record's timestamp (Job.Timestamp's answer, or the Kafka record
	// time when the job has no extractor); in OnTimer the timer's time;
	// in OnBroadcast the broadcast record's Kafka time. Outputs carry it.
	Timestamp() time.Time
	// CurrentWatermark is the task's event-time watermark: no record with
	// an earlier timestamp is expected any more, so one that comes is
	// late. It is the zero time until the task has seen a timestamp, and
	// always zero for a job that does not declare EventTime.
	CurrentWatermark() time.Time
	// Timers registers and deletes timers of the current key. A timer
	// fires once, through Job.OnTimer, in the epoch that sees its time
	// pass; it commits with that epoch.
	Timers() Timers
}

// Timers is the timer service of the current key, as in Flink: one timer per
// key, time domain and millisecond, so registering the same one twice leaves
// one. Times are truncated to the millisecond.
//
// Registering fails the record (it goes to the dead-letter topic) if the job
// has no OnTimer, or, for event time, does not declare EventTime.
type Timers interface {
	// RegisterEventTime sets a timer that fires once the task's watermark
	// reaches at.
	RegisterEventTime(at time.Time)
	// RegisterProcessingTime sets a timer that fires once the instance's
	// processing-time clock (Context.Now) reaches at.
	RegisterProcessingTime(at time.Time)
	// DeleteEventTime removes the key's event-time timer at at, if any.
	DeleteEventTime(at time.Time)
	// DeleteProcessingTime removes the key's processing-time timer at at,
	// if any.
	DeleteProcessingTime(at time.Time)
}

// Timer is a timer that fired: its domain, its time and its key.
type Timer = kstate.Timer

// TimeDomain says which clock a timer runs on.
type TimeDomain = kstate.TimeDomain

// The time domains of a timer.
const (
	EventTime      = kstate.EventTime
	ProcessingTime = kstate.ProcessingTime
)

// TimerFunc handles a timer that fired. The Context is scoped to the timer's
// key; its Timestamp is the timer's time. What it writes and emits commits
// with the epoch, exactly as for a record, and the timer is gone once that
// epoch commits (it may register itself again). A non-nil error drops its
// writes and outputs and sends a dead letter (sluice.stage=timer, the key,
// no value) instead; an error wrapped with Fatal stops the instance.
//
// Once the instance shuts down (ctx.Context() is cancelled), a handler cut
// short by it returns a *UnavailableError, or an error wrapping
// context.Canceled. Its writes and outputs are dropped and the timer stays
// registered. For a processing-time timer, or any timer of a job with
// Prefetch, the timer is left for the next start, no more timers fire,
// and the final checkpoint commits the rest of the epoch. For an
// event-time timer of a job without Prefetch, which the next start's
// records could otherwise pass, the instance stops without the final
// checkpoint, as for Fatal: the epoch is processed again at the next
// start.
type TimerFunc func(ctx Context, t Timer) error

// TimestampFunc extracts a record's event time. An error sends the record to
// the dead-letter topic (sluice.stage=timestamp) before Process sees it.
type TimestampFunc func(rec *Record) (time.Time, error)

// KafkaTime is a TimestampFunc that takes the record's Kafka timestamp (the
// producer's create time or the broker's log-append time, per the topic).
func KafkaTime(rec *Record) (time.Time, error) { return rec.Timestamp, nil }

// OutputTag names a side output of a job: declare it once,
//
//	var late = sluice.OutputTag("late")
//
// list it in Job.SideOutputs, and bind it to a topic in the options. A job
// emits to it with Context.Output.
type OutputTag string

// ProcessFunc handles one record. A non-nil error sends the record to the
// dead-letter topic with headers saying why: its state changes and its
// emitted records are dropped, and processing continues. Wrap an error with
// Fatal to stop the instance instead.
type ProcessFunc func(ctx Context, rec *Record) error

// Job declares a processing job. Declare it once, Validate it, then run it.
type Job struct {
	// Name identifies the job in logs, metrics and dead-letter headers.
	Name string
	// Process is called for each input record, in partition order; again
	// for a record whose epoch aborted and is replayed (only the
	// attempt that commits has effects).
	Process ProcessFunc
	// Emits reports whether the job writes to the output topic, which is
	// then required.
	Emits bool
	// SideOutputs are the side outputs the job may write to; each must be
	// bound to a topic when the instance is configured.
	SideOutputs []OutputTag

	// States names the job's state (the names its kstate descriptors were
	// declared with). A restore from a savepoint (Options.RestoreFrom)
	// refuses a savepoint holding state of other names, as Flink refuses
	// state it cannot map; a job that lists none is not checked.
	States []string
	// QueryState, when set, reads the state named state (one of States)
	// of the scope's key and returns it as a value that encodes to JSON,
	// for readers that know the job by name but not its types: the
	// processor binary's /state endpoint. The scope is a query's
	// (Instance.Query): read-only, over committed state. ok is false when
	// the key has no such state. A job without it is queried through its
	// descriptors alone (Instance.Query).
	QueryState func(s kstate.Scope, state string) (v any, ok bool, err error)

	// OnBroadcast handles the records of Options.BroadcastTopic, the only
	// place where broadcast state (kstate.Broadcast) may be written; a job
	// without a broadcast topic leaves it nil.
	OnBroadcast BroadcastFunc

	// OnTimer handles the timers the job registers (Context.Timers); a job
	// that registers none leaves it nil.
	OnTimer TimerFunc
	// EventTime declares that the job works in event time: the task keeps
	// a watermark (the largest timestamp seen, less the configured
	// out-of-orderness), event-time timers fire as it passes them, and
	// Context.CurrentWatermark reports it. It requires Timestamp.
	EventTime bool
	// Timestamp gives each record's event time. Nil means the Kafka
	// record time (KafkaTime), which an EventTime job must choose
	// explicitly: producer clocks are rarely the time a job means.
	Timestamp TimestampFunc

	// Prefetch, when set, sees each polled batch of a running task before
	// any of its records is processed: a job that computes remotely (the
	// function job, package function) makes its calls here, for the
	// batch's keys at once, and Process then applies the answers record
	// by record. See PrefetchFunc for what the engine guarantees.
	Prefetch PrefetchFunc

	// Close, when set, releases what the job holds beyond its runs: the
	// function job (package function) unregisters its metrics from
	// function.Options.Registry, so that a new job can register its own
	// there. Instance.Close (so Pipeline.Close) calls it, after
	// unregistering the instance's metrics, and nothing else does: not
	// Run when it returns, not the processor binary, which exits. A Job
	// whose New (or NewPipeline) failed is never closed by the engine, so
	// its caller closes it or gives it to another try. A closed Job is
	// done: do not give it to a new Instance (the function job refuses
	// to run once closed; build another with function.New). Close may be
	// called more than once (a Job given to several Instances is closed by
	// each, at the first Instance.Close): every call after the first must
	// do nothing and return nil.
	Close func() error
}

// PrefetchFunc is called once per polled batch of a task, per input topic
// partition, with the batch's records that are not yet reflected in state,
// in partition order, before Process sees the first of them. It may only
// read state: anything it writes through the store is dropped.
//
// The same records may come again (an abort rewinds the task and the
// batch is polled anew; Prefetch is then called again), so what Prefetch
// computes must depend only on the state and the records.
//
// A *UnavailableError rewinds the task's consumer to the batch's first
// record: none of the batch is processed, the instance reports not ready
// (/readyz) and the batch comes again after a backoff. Any other error
// stops the instance.
//
// In a job with Prefetch and EventTime, event-time timers fire after the
// batch, between polls, not right after the record that moves the
// watermark past them: a timer's handler changing a key's state inside
// the batch would change it under what Prefetch computed before it. (So
// records later than a timer can come before it, as in Flink, whose
// watermarks come between records now and then.)
type PrefetchFunc func(ctx PrefetchContext, recs []*Record) error

// PrefetchContext is what a Prefetch gets: the task, the clock and read
// access to the task's state as it is before the batch (a kstate.Scope for
// any key can be built over Store).
type PrefetchContext interface {
	// Context is cancelled when the instance shuts down.
	Context() context.Context
	// Task is the task (input partition number) of the batch.
	Task() int32
	// Now is the processing-time clock.
	Now() time.Time
	// Store is the task's state; read only.
	Store() *kstate.Store
	// CurrentWatermark is the task's event-time watermark before the
	// batch (Context.CurrentWatermark's): zero until the task has one,
	// and always for a job that does not declare EventTime.
	CurrentWatermark() time.Time
}

// UnavailableError says that the service a Prefetch calls cannot be reached
// (connection refused or reset, no such host): the batch is not a failure
// of its records, it waits until the service is back. From a TimerFunc cut
// short by the shutdown, it keeps the timer for the next start (see
// TimerFunc).
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// StageError names the stage a record failed in, for the dead-letter
// header sluice.stage (HeaderStage) instead of "process".
type StageError struct {
	Stage string
	Err   error
}

func (e *StageError) Error() string { return e.Stage + ": " + e.Err.Error() }
func (e *StageError) Unwrap() error { return e.Err }

// Validate checks the declaration before any I/O happens.
func (j Job) Validate() error {
	if j.Name == "" {
		return errors.New("job: Name is empty")
	}
	if j.Process == nil {
		return fmt.Errorf("job %s: Process is nil", j.Name)
	}
	if j.EventTime && j.Timestamp == nil {
		return fmt.Errorf("job %s: EventTime needs a Timestamp extractor (sluice.KafkaTime takes the Kafka record time)", j.Name)
	}
	for i, tag := range j.SideOutputs {
		if tag == "" {
			return fmt.Errorf("job %s: side output %d has an empty tag", j.Name, i)
		}
		for _, other := range j.SideOutputs[:i] {
			if other == tag {
				return fmt.Errorf("job %s: side output %q is declared twice", j.Name, tag)
			}
		}
	}
	return nil
}

// fatalError marks an error that must stop the instance.
type fatalError struct{ err error }

func (e fatalError) Error() string { return "fatal: " + e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

// Fatal wraps err so that returning it from a ProcessFunc stops the instance
// (the open epoch aborts; nothing of it is committed) instead of sending the
// record to the dead-letter topic.
func Fatal(err error) error { return fatalError{err} }

// IsFatal reports whether err was wrapped with Fatal.
func IsFatal(err error) bool {
	var f fatalError
	return errors.As(err, &f)
}

// DecodeError marks a record whose bytes could not be decoded. The
// dead-letter headers then name the decode stage rather than processing.
type DecodeError struct{ Err error }

func (e *DecodeError) Error() string { return "decode: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }
