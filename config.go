package sluice

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink"
)

// Guarantee is the delivery guarantee of an instance.
type Guarantee string

const (
	// ExactlyOnce commits each epoch's outputs, state changes and input
	// offsets in one Kafka transaction (the default).
	ExactlyOnce Guarantee = "exactly_once"
	// AtLeastOnce flushes outputs and state changes, then commits offsets,
	// without a transaction: a crash replays the epoch.
	AtLeastOnce Guarantee = "at_least_once"
)

// Options configures an instance. Brokers, AppID, InstanceID, Job,
// InputTopics and (for a job that emits) OutputTopic are required; every
// other field has a default, the one the processor binary uses, and New
// reports a bad value naming the field. The library never reads the
// environment (cmd/processor maps env variables onto Options).
type Options struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientOpts are extra franz-go options (TLS, SASL) for every client
	// the instance makes, the changelog restore's included. They win
	// over the input consumer's fetch bound (kgo.FetchMaxPartitionBytes,
	// 64 KiB times Parallelism, raised to the input's batches with
	// Parallelism or several input topics; one set to exactly that first
	// bound counts as the instance's own until a later session asks for
	// a raised one: docs/operations.md#fetch-size) and its
	// producer's linger (kgo.ProducerLinger, 10 ms:
	// docs/operations.md#producer-linger). A produce hook must not keep
	// a *kgo.Record past its promise, nor replace its Context: the
	// instance reuses its output and changelog records once produced, and
	// reads their Context.
	ClientOpts []kgo.Opt

	// AppID is the consumer group id and the prefix of the transactional
	// id and of the internal topics (<AppID>-changelog, <AppID>-dlq).
	// Required.
	AppID string
	// InstanceID is this instance's stable identity: its static group
	// membership (group.instance.id) and its transactional id. Give every
	// replica its own and keep it across restarts. Required.
	InstanceID string
	// Job is what the instance runs; New validates it (Job.Validate).
	Job Job

	// InputTopics are the topics the job reads: one, or several
	// co-partitioned ones (the same partition count; a task owns
	// partition p of each, docs/topology.md). Required.
	InputTopics []string
	// OutputTopic is where Context.Emit writes; required when Job.Emits.
	OutputTopic string
	// DLQTopic receives the records and timers the job fails on, with
	// headers saying why. Default <AppID>-dlq.
	DLQTopic string
	// SideOutputTopics binds each of the job's side outputs
	// (Job.SideOutputs) to a topic; every declared tag must be bound.
	SideOutputTopics map[OutputTag]string

	// StateDir holds one bbolt file per task. Default "state", relative to
	// the working directory.
	StateDir string
	// Backend is "bbolt" (default: on disk, survives restarts) or
	// "memory" (rebuilt from the changelog at every start).
	Backend string
	// OpenBackend, if set, opens a task's backend instead of kstate.Open
	// (same arguments): a seam for wrapping the store, for example to
	// inject disk faults in tests. When an epoch commits, the Apply of
	// several tasks' backends run at once (whatever Parallelism is), so
	// what the backends share must be safe for that; and each Apply runs
	// while its task processes the next epoch, whose reads of keys the
	// epoch did not change call the backend's Get alongside (the Backend
	// contract allows reads beside Apply; scans wait for it). A backend
	// that is a kstate.BulkApplier takes a full restore's batches through
	// ApplyBulk; a wrapper that is not gets them through Apply.
	OpenBackend func(kind, dir, task string) (kstate.Backend, error)

	// Guarantee is ExactlyOnce (default) or AtLeastOnce.
	Guarantee Guarantee
	// Checkpoint sets the epochs. Zero fields take the defaults the
	// processor binary uses: Interval 100ms; Timeout the transaction
	// timeout minus the epoch (DefaultCheckpointTimeout); MinPause none;
	// TolerableFailures 3 (a negative value tolerates none).
	Checkpoint barrier.Config

	// TransactionTimeout is the Kafka transaction timeout; zero derives it
	// from the epoch (DefaultTransactionTimeout). SessionTimeout defaults
	// to 45s; RebalanceTimeout to DefaultRebalanceTimeout.
	TransactionTimeout time.Duration
	SessionTimeout     time.Duration
	RebalanceTimeout   time.Duration
	// GroupProtocol is "classic" (default: JoinGroup/SyncGroup, any
	// broker) or "consumer" (KIP-848, Kafka 4.0+).
	GroupProtocol string

	// DisableTopicCreation stops the instance from creating missing output,
	// dead-letter and changelog topics at start (it then waits for them).
	// By default it creates them; existing topics are never altered.
	DisableTopicCreation bool
	// Partitions is the partition count of the output and DLQ topics the
	// instance creates; default the input's. The changelog always gets the
	// input's.
	Partitions int32

	// StayInGroupOnShutdown keeps a gracefully stopped instance in the
	// group: as a static member it keeps its partitions until its session
	// times out, so a quick restart gets them back without a rebalance.
	// By default it leaves after its final checkpoint, so its partitions
	// move at once (the processor binary's SLUICE_LEAVE_ON_SHUTDOWN=true).
	StayInGroupOnShutdown bool

	// EpochMaxKeys and EpochMaxBytes bound one task's write-set: an epoch
	// that changes more keys, or more key and value bytes, ends early
	// (barrier.ReasonBudget), so memory and the size of one transaction
	// stay bounded whatever the input rate. EpochMaxBytes also bounds the
	// memory the write-set takes in the epoch (kstate.Store.EpochMemory),
	// which can exceed the bytes changed when most writes overwrite a few
	// keys; a write-set also keeps the nodes of its hot keys from one
	// epoch to the next, at most 4 MiB beside the budget. Defaults
	// 100,000 and 64 MiB.
	EpochMaxKeys  int
	EpochMaxBytes int

	// StateCleanupDelay is how long the state file of a task this instance
	// no longer owns is kept before it is deleted (Kafka Streams'
	// state.cleanup.delay.ms): long enough for a partition that comes back
	// after a rebalance to restore from its local file, short enough that a
	// stale file does not linger. Default 10 minutes.
	StateCleanupDelay time.Duration

	// Clock is the processing-time clock: what Context.Now returns, when
	// processing-time timers fire, what state TTL counts from. Nil is the
	// wall clock. A test clock that implements
	//
	//	NotifyAdvance(wake func())
	//
	// is told how to wake the loop when it moves (see sluicetest). Epochs,
	// timeouts and backoff always run on the wall clock.
	Clock Clock
	// MaxOutOfOrderness is how far behind the largest timestamp seen the
	// watermark of an EventTime job stays: records up to this much out of
	// order are not late. Default 0.
	MaxOutOfOrderness time.Duration
	// IdleTimeout, when positive, lets an input that has had no record for
	// this long stop holding the watermark back (Flink's withIdleness),
	// for tasks that read more than one input topic. Default 0: an input
	// holds event time back until it has data.
	IdleTimeout time.Duration
	// MaxTaskIdle bounds how long a task that reads several input topics
	// holds the other topics' records back while one topic's next records
	// are on the broker but not fetched yet, so that it takes the records
	// in timestamp order (Kafka Streams' max.task.idle.ms idea, bounded:
	// there 0 still waits for records on the broker). Past it the
	// task goes on without them, and they may come out of order. Default
	// DefaultMaxTaskIdle; a negative value never holds records back.
	MaxTaskIdle time.Duration

	// TTLSweepEntries bounds the background removal of expired state
	// (kstate.WithTTL): each task examines at most this many entries with
	// a TTL per checkpoint interval, resuming where it stopped. Default
	// 10,000.
	TTLSweepEntries int

	// MaxPollRecords bounds one poll (times Parallelism when tasks are
	// processed in parallel), and the processing-time timers fired per
	// loop iteration. Default 10,000.
	MaxPollRecords int
	// Parallelism is how many tasks process their records at once (Kafka
	// Streams' num.stream.threads): each poll's records are split by task,
	// and up to this many tasks run on their own goroutines, all in the
	// instance's one transaction per epoch. Default 1: one goroutine
	// processes every task. Above 1, the job's code is called
	// concurrently for different tasks (never for the same task), so what
	// it shares across tasks must be safe for that: Job.Process,
	// Job.OnTimer and Job.Timestamp, the codecs of its state (a kstate
	// descriptor is shared by every task), window functions, the stores
	// OpenBackend returns, Options.Clock and Options.Sink's Check (through
	// WriteRow). A job with a Prefetch is always processed by one
	// goroutine. A poll takes up to MaxPollRecords × Parallelism records,
	// and the epoch budget is checked after each poll, so a task may pass
	// it by that many records. The input consumer's fetch takes up to
	// 64 KiB × Parallelism of each partition (at most 1 MiB), or the
	// input's largest batch if larger (rounded up to a power of two, at
	// most 1 MiB; ClientOpts may set the bound), so that a poll holds
	// several tasks' records. See docs/operations.md.
	Parallelism int
	// PipelinedEpochs processes each epoch while the one before commits
	// (exactly-once only): the flush of its outputs, changelog and
	// marker runs beside the next epoch's processing, whose outputs are
	// held until that commit ended and then produced in their own
	// transaction. An epoch whose commit fails aborts the one after it
	// with it. Default false: the loop waits for each commit. See
	// docs/operations.md#pipelined-epochs for when it helps and when a
	// commit is not overlapped.
	PipelinedEpochs bool
	// RestoreConcurrency is how many tasks at once may restore more than
	// a batch (10,000 records) of their changelog: restores from scratch,
	// and long tails. The others wait their turn, paused; the short tail
	// that a task with a kept state file reads never waits. Such a
	// restore is CPU-bound (decoding, bbolt) and holds some 100 MiB of
	// heap while it runs (a batch of up to 16 MiB, bbolt's copies of the
	// pages a batch touches, a fetch, the collector's headroom), so this
	// bounds an instance's restore memory whatever its partition count.
	// Default 0: GOMAXPROCS, at least 2. See docs/operations.md.
	RestoreConcurrency int

	// StandbyReplicas is how many other instances keep a copy of each
	// task's state (Kafka Streams' num.standby.replicas): a standby
	// applies the task's changelog as its epochs commit, in a state file
	// of its own, and the group's leader gives a task whose instance left
	// or crashed to the instance with its most recent copy, which then
	// restores only the few epochs its copy lacks instead of the whole
	// changelog. It costs each standby's disk, and a read of the
	// changelog (docs/operations.md#standby-replicas). It needs the bbolt
	// backend and the classic group protocol, whose assignment Sluice
	// makes itself; at most the other instances there are stand by.
	// Default 0: none.
	StandbyReplicas int
	// MaxWarmupReplicas bounds the warm-up replicas the group's leader
	// assigns at once, with StandbyReplicas (Kafka Streams'
	// max.warmup.replicas). A task whose place in the even spread is an
	// instance without a caught-up copy of it (one that just joined)
	// stays where a copy is caught up (the instance running it), while
	// that instance builds a copy as a standby, a warm-up; once the copy
	// is within AcceptableRecoveryLag of the changelog's end, the
	// instance asks the group to rebalance and the task moves, restoring
	// about that lag and the epochs committed since. A standby the task
	// already had there is a warm-up without counting against this
	// bound. Default 0: DefaultMaxWarmupReplicas; negative: no warm-ups,
	// tasks move at once and restore whatever the new instance lacks.
	// See docs/operations.md#warm-up-replicas.
	MaxWarmupReplicas int
	// Rack is the instance's rack or availability zone, as Kafka's
	// client.rack. With StandbyReplicas, each task's standbys go first to
	// instances in racks other than its own instance's and its other
	// standbys', so that losing a rack leaves a copy (Kafka Streams'
	// rack-aware standby assignment), ahead of the even spread. Fetches
	// still go to the partition leaders. Default "": unknown, any
	// instance will do.
	Rack string
	// AcceptableRecoveryLag is how many changelog offsets a copy may be
	// behind the changelog's end (or the group's freshest copy) and still
	// count as caught up: a task moves only to a caught-up copy while one
	// exists (Kafka Streams' acceptable.recovery.lag). Default 0:
	// DefaultAcceptableRecoveryLag.
	AcceptableRecoveryLag int64

	// BroadcastTopic is read whole by every instance; every task applies
	// each of its records to its own copy of the job's broadcast state
	// through Job.OnBroadcast, in its epochs (docs/topology.md). Empty:
	// none.
	BroadcastTopic string

	// RestoreFrom is a savepoint to seed the app's tasks from (the
	// location `processor savepoint` printed): each task whose changelog
	// holds no epoch marker yet starts from its part of the savepoint, its
	// keys placed by the input partitioner over the current partition
	// count (docs/savepoints.md). Tasks that already have a marker ignore
	// it, so it may stay set. Run refuses (*RestoreError) a savepoint of
	// another job, or with state the job does not declare in Job.States.
	// An s3:// location needs package savepoint/s3 in the program
	// (import _ "github.com/sluicehq/sluice/savepoint/s3"), a gs:// one
	// package savepoint/gcs.
	RestoreFrom string
	// AllowNonRestoredState restores from RestoreFrom even when it holds
	// state the job does not declare (or timers for a job without OnTimer,
	// or offsets of an input it no longer reads): that state is dropped,
	// as Flink's --allowNonRestoredState does.
	AllowNonRestoredState bool

	// Logger receives the instance's logs. Default slog.Default().
	Logger *slog.Logger

	// Set by NewPipeline for its stages: the app whose control topic the
	// stage follows (the pipeline's, not the stage's own app id), the
	// repartition topic Forward writes to, and whether the stage's input
	// is a repartition topic to purge behind its committed offsets.
	controlApp   string
	forwardTopic string
	purgeInput   bool
	// pipelineStages, set on a pipeline's first stage, names its later
	// stages: RestoreFrom must then be a pipeline's savepoint of the same
	// stages (savepoint.FormatPipeline), and only then.
	pipelineStages []string

	// Registry receives the instance's metrics. Default a private
	// registry: pass your own to export them. The metrics stay registered
	// after Run returns (Run may be called again) until Instance.Close,
	// and a registry takes one Instance's: New refuses a second with an
	// error. Close the one before, give each Instance a registry of its
	// own, or wrap a shared one for each with
	// prometheus.WrapRegistererWith and a label value of its own.
	Registry prometheus.Registerer

	// Sink, if set, is an outside system the job writes rows to
	// (WriteRow), exactly once: each task's rows of an epoch commit with
	// the epoch (docs/sinks.md). It needs ExactlyOnce. The caller owns it
	// and closes it after Run returned.
	Sink txsink.EpochSink

	// Hook, if set, is called on the loop goroutine at each step of the
	// epoch protocol named by the Point constants: for tracing, and for
	// crash tests that kill the process exactly there.
	Hook func(point string)
}

// Clock tells the processing time; see Options.Clock.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Steps of the epoch protocol passed to Options.Hook.
const (
	PointBeforePreCommit = "before-precommit" // barrier placed, nothing of the epoch produced to the changelog
	PointBeforeCommit    = "before-commit"    // changelog and markers produced, EndTxn not sent
	PointAfterCommit     = "after-commit"     // transaction committed, backends not yet applied
	PointAfterApply      = "after-apply"      // every task's backend holds the epoch: the writes run behind the next epoch, so this may come after its records, its commit, or a release or the session's end that waited for them
)

func (c *Options) at(point string) {
	if c.Hook != nil {
		c.Hook(point)
	}
}

// The timing defaults, here and nowhere else: the processor binary derives
// the values it logs and validates with these functions too.
const (
	DefaultCheckpointInterval = 100 * time.Millisecond
	DefaultSessionTimeout     = 45 * time.Second
	DefaultTolerableFailures  = 3
	DefaultMaxTaskIdle        = time.Second
	// DefaultMaxWarmupReplicas and DefaultAcceptableRecoveryLag are
	// Kafka Streams' defaults of max.warmup.replicas and
	// acceptable.recovery.lag.
	DefaultMaxWarmupReplicas     = 2
	DefaultAcceptableRecoveryLag = 10000
	minTransactionTimeout        = 10 * time.Second
	minRebalanceTimeout          = time.Second
)

// Epoch is the least time one transaction stays open: the checkpoint
// interval, stretched by the minimum pause between checkpoints.
func Epoch(interval, minPause time.Duration) time.Duration { return max(interval, minPause) }

// DefaultTransactionTimeout is max(10s, 10 × epoch): long enough that a
// slow commit is not aborted by the broker, short enough that a crashed
// instance's transaction does not hold readers back for long.
func DefaultTransactionTimeout(epoch time.Duration) time.Duration {
	return max(minTransactionTimeout, 10*epoch)
}

// DefaultCheckpointTimeout is the transaction timeout minus one epoch: a
// transaction opens when its epoch begins, so a checkpoint that took longer
// would be aborted by the broker anyway.
func DefaultCheckpointTimeout(transactionTimeout, epoch time.Duration) time.Duration {
	return transactionTimeout - epoch
}

// DefaultRebalanceTimeout is 2/3 of the session timeout, at least 1s.
// kfake's classic coordinator can wait for a member that died in JoinGroup
// until the rebalance timeout, restarted by every new JoinGroup; a rebalance
// timeout below the session timeout (with kgo.RequestTimeoutOverhead(5s))
// was measured to keep such groups moving (docs/architecture.md, "Design
// choices"). Real Kafka is not hurt by it: members only need the rebalance
// timeout to finish their final epoch commit.
func DefaultRebalanceTimeout(session time.Duration) time.Duration {
	return max(minRebalanceTimeout, session*2/3)
}

// fillTiming fills the zero timing fields with their defaults.
func (c *Options) fillTiming() {
	if c.Checkpoint.Interval == 0 {
		c.Checkpoint.Interval = DefaultCheckpointInterval
	}
	epoch := Epoch(c.Checkpoint.Interval, c.Checkpoint.MinPause)
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout(epoch)
	}
	if c.Checkpoint.Timeout == 0 {
		c.Checkpoint.Timeout = DefaultCheckpointTimeout(c.TransactionTimeout, epoch)
	}
	switch {
	case c.Checkpoint.TolerableFailures == 0:
		c.Checkpoint.TolerableFailures = DefaultTolerableFailures
	case c.Checkpoint.TolerableFailures < 0:
		c.Checkpoint.TolerableFailures = 0
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout(c.SessionTimeout)
	}
	if c.MaxTaskIdle == 0 {
		c.MaxTaskIdle = DefaultMaxTaskIdle
	}
}

func (c *Options) fill() error {
	c.fillTiming()
	if err := c.checkBroadcast(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.MaxPollRecords <= 0 {
		c.MaxPollRecords = 10000
	}
	if c.Parallelism == 0 {
		c.Parallelism = 1
	}
	if c.RestoreConcurrency == 0 {
		c.RestoreConcurrency = max(2, runtime.GOMAXPROCS(0))
	}
	if c.TTLSweepEntries <= 0 {
		c.TTLSweepEntries = 10000
	}
	if c.EpochMaxKeys <= 0 {
		c.EpochMaxKeys = 100000
	}
	if c.EpochMaxBytes <= 0 {
		c.EpochMaxBytes = 64 << 20
	}
	if c.OpenBackend == nil {
		c.OpenBackend = kstate.Open
	}
	if c.StateCleanupDelay <= 0 {
		c.StateCleanupDelay = 10 * time.Minute
	}
	if c.MaxWarmupReplicas == 0 {
		c.MaxWarmupReplicas = DefaultMaxWarmupReplicas
	}
	if c.AcceptableRecoveryLag == 0 {
		c.AcceptableRecoveryLag = DefaultAcceptableRecoveryLag
	}
	if c.Guarantee == "" {
		c.Guarantee = ExactlyOnce
	}
	if c.Backend == "" {
		c.Backend = "bbolt"
	}
	if c.StateDir == "" {
		c.StateDir = "state"
	}
	if c.DLQTopic == "" {
		c.DLQTopic = c.AppID + "-dlq"
	}
	if c.GroupProtocol == "" {
		c.GroupProtocol = "classic"
	}
	switch {
	case len(c.Brokers) == 0:
		return errors.New("sluice: Options.Brokers is empty: give at least one seed broker, host:port")
	case c.AppID == "":
		return errors.New("sluice: Options.AppID is empty: it names the consumer group and the internal topics")
	case c.InstanceID == "":
		return errors.New("sluice: Options.InstanceID is empty: give each replica a stable id")
	case len(c.InputTopics) == 0:
		return errors.New("sluice: Options.InputTopics is empty")
	case c.Job.Emits && c.OutputTopic == "":
		return fmt.Errorf("sluice: Options.OutputTopic is empty, and job %s emits", c.Job.Name)
	case c.Guarantee != ExactlyOnce && c.Guarantee != AtLeastOnce:
		return fmt.Errorf("sluice: Options.Guarantee %q: want exactly_once or at_least_once", c.Guarantee)
	case c.GroupProtocol != "classic" && c.GroupProtocol != "consumer":
		return fmt.Errorf("sluice: Options.GroupProtocol %q: want classic or consumer", c.GroupProtocol)
	case c.SessionTimeout < 0:
		return fmt.Errorf("sluice: Options.SessionTimeout %s is negative (0 = %s)", c.SessionTimeout, DefaultSessionTimeout)
	case c.RebalanceTimeout < 0:
		return fmt.Errorf("sluice: Options.RebalanceTimeout %s is negative (0 = 2/3 of SessionTimeout)", c.RebalanceTimeout)
	case c.TransactionTimeout < 0:
		return fmt.Errorf("sluice: Options.TransactionTimeout %s is negative (0 = derived from the checkpoint interval)", c.TransactionTimeout)
	case c.MaxOutOfOrderness < 0:
		return fmt.Errorf("sluice: Options.MaxOutOfOrderness %s is negative", c.MaxOutOfOrderness)
	case c.IdleTimeout < 0:
		return fmt.Errorf("sluice: Options.IdleTimeout %s is negative", c.IdleTimeout)
	case c.Parallelism < 0:
		return fmt.Errorf("sluice: Options.Parallelism %d is negative (0 = 1: one goroutine processes every task)", c.Parallelism)
	case c.RestoreConcurrency < 0:
		return fmt.Errorf("sluice: Options.RestoreConcurrency %d is negative (0 = GOMAXPROCS, at least 2)", c.RestoreConcurrency)
	case c.StandbyReplicas < 0:
		return fmt.Errorf("sluice: Options.StandbyReplicas %d is negative (0 = none)", c.StandbyReplicas)
	case c.AcceptableRecoveryLag < 0:
		return fmt.Errorf("sluice: Options.AcceptableRecoveryLag %d is negative (0 = %d)", c.AcceptableRecoveryLag, DefaultAcceptableRecoveryLag)
	case c.StandbyReplicas > 0 && c.Backend != "bbolt":
		return fmt.Errorf("sluice: Options.StandbyReplicas needs the bbolt backend: a standby keeps its copy in a state file (Backend is %q)", c.Backend)
	case c.StandbyReplicas > 0 && c.GroupProtocol != "classic":
		return errors.New("sluice: Options.StandbyReplicas needs GroupProtocol classic: under the consumer protocol (KIP-848) the broker assigns partitions and knows nothing of standbys")
	}
	if err := c.Job.Validate(); err != nil {
		return err
	}
	for _, tag := range c.Job.SideOutputs {
		if c.SideOutputTopics[tag] == "" {
			return fmt.Errorf("sluice: job %s writes to side output %q, which Options.SideOutputTopics does not bind to a topic", c.Job.Name, tag)
		}
	}
	if err := c.Checkpoint.Validate(); err != nil {
		return err
	}
	if c.Sink != nil && c.Guarantee != ExactlyOnce {
		return fmt.Errorf("sluice: Options.Sink needs Options.Guarantee %s: at-least-once has no Kafka transaction for the sink's to follow", ExactlyOnce)
	}
	if c.PipelinedEpochs && c.Guarantee != ExactlyOnce {
		return errors.New("sluice: Options.PipelinedEpochs needs Options.Guarantee exactly_once: at-least-once has no transaction to overlap")
	}
	if c.Sink != nil && len(txsink.TaskPrefix(c.AppID, math.MaxInt32)) > 150 {
		return fmt.Errorf("sluice: Options.AppID is too long for the sink's transaction ids (at most 200 bytes with the epoch)")
	}
	if c.Guarantee == ExactlyOnce && c.TransactionTimeout <= c.Checkpoint.Interval {
		return fmt.Errorf("sluice: Options.TransactionTimeout %s must exceed Options.Checkpoint.Interval %s", c.TransactionTimeout, c.Checkpoint.Interval)
	}
	return nil
}

// transactionalID is stable across restarts of an instance, so a restarted
// instance fences its predecessor and aborts its dangling transaction at
// once (InitProducerID bumps the epoch).
func (c *Options) transactionalID() string { return c.AppID + "-" + c.InstanceID }
