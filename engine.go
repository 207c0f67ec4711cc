package sluice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/promreg"
	"github.com/sluicehq/sluice/txsink"
)

// Instance is one processor instance: a member of the app's consumer group
// running a task per assigned input partition.
type Instance struct {
	cfg            Options
	log            *slog.Logger
	m              *metrics
	changelogTopic string
	changelogInfo  changelog.TopicInfo // read at start, before any session
	batchMax       int                 // producer batch limit, from the topics' max.message.bytes
	fetchBound     *fetchBound         // nil unless cfg.adaptsFetchBound

	adm   *kadm.Client
	admCl *kgo.Client
	sasl  *saslWatch // on every client: credentials refused by closing the connection

	// seed is the savepoint new tasks are seeded from (Options.RestoreFrom),
	// opened and checked by Run before it connects; partitions is the
	// input's partition count, read at start.
	seed       *seedSource
	partitions int32
	// hasControl: the app's control topic exists (control.go).
	hasControl bool
	// bcPartitions is the broadcast topic's partition count (broadcast.go).
	bcPartitions int32
	// purging: a purge of consumed repartition records is under way;
	// purgeFailed: the last one failed (pipeline.go).
	purging, purgeFailed atomic.Bool

	// kip848 says the group runs the consumer protocol: asked for, and
	// offered by the brokers. Set by prepareGroup before any session.
	kip848 bool

	// running says Run is running: Run may be called again once it has
	// returned, never twice at once. Close takes it for good and sets
	// closed, under closeMu.
	running atomic.Bool
	closeMu sync.Mutex
	closed  bool
	// collectors are the metrics New registered in cfg.Registry, for
	// Close to unregister.
	collectors []prometheus.Collector

	// Read by /readyz and metrics from other goroutines.
	ready           atomic.Bool
	committedEpochs atomic.Uint64
	// missingTopic is a topic a record of an epoch since the last commit
	// was refused for with UNKNOWN_TOPIC_OR_PARTITION (or
	// UNKNOWN_TOPIC_ID): the instance is not ready until an epoch commits
	// or tasks are released (missingtopic.go).
	missingTopic atomic.Pointer[string]
	txnOpenedAt  atomic.Int64 // unix nanoseconds; 0 when no transaction is open
	commitTxnAge atomic.Int64 // age of the transaction at the last commit, nanoseconds
	// unreleasedSince is when the group first answered this member
	// UNRELEASED_INSTANCE_ID without it joining since (see identity.go).
	unreleasedSince time.Time

	// Rebalance callbacks run on franz-go's goroutines; they only record
	// what happened here, and the loop acts on it after its poll returns.
	evMu            sync.Mutex
	ev              []event
	session         atomic.Uint64 // serial of the current session; older sessions' callbacks are void
	rebalanceWanted atomic.Bool
	rebalanceWaits  chan struct{} // signalled (never blocking) when a rebalance waits on us

	// restoreSlots holds a token for each restore reading more than a
	// batch of its changelog (at most Options.RestoreConcurrency).
	restoreSlots chan struct{}

	wakeMu sync.Mutex
	wake   context.CancelFunc // cancels the loop's current poll
	woken  atomic.Bool        // a wake-up came while the loop was not polling

	killed atomic.Bool    // see Kill
	probes chan chan bool // see Quiet

	clock Clock // processing time (Options.Clock or the wall clock)

	// sinkConflicts holds, per task, the epoch whose sink pre-commit found
	// the epoch applied already (see handleConflict); only the loop's
	// goroutine touches it.
	sinkConflicts map[int32]uint64
	sinkM         *sinkMetrics // nil without a sink

	// queries is what Query reads of the running tasks (query.go).
	queries queries

	// standbys are the standby replicas this instance keeps (standby.go);
	// nil without Options.StandbyReplicas.
	standbys *standbys

	// poison is what sessions learned of inputs whose outputs can never be
	// produced, per task; only the goroutine running sessions touches it.
	poison map[int32]map[inputRef]*poison
}

// event is one rebalance callback: what happened to which tasks. Events
// are kept in the order they happened: an assignment followed by a revoke
// of the same partition means something else than the reverse.
type event struct {
	kind   string // "assigned", "revoked" or "lost"
	tasks  []int32
	parts  map[string][]int32 // the partitions by topic (tasks is their numbers)
	serial uint64             // the session whose client called back
}

// errSessionBroken says the session must be closed and rebuilt: a fenced
// producer, a failed EndTxn, or a lost transaction state.
var errSessionBroken = errors.New("session broken")

// New validates cfg and builds an instance. Nothing touches the network
// until Run.
func New(cfg Options) (*Instance, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if len(cfg.InputTopics) > 1 && cfg.Job.Prefetch != nil {
		return nil, fmt.Errorf("sluice: job %s: Prefetch with several input topics is not supported yet", cfg.Job.Name)
	}
	in := &Instance{
		cfg:            cfg,
		log:            cfg.Logger.With("app", cfg.AppID, "instance", cfg.InstanceID),
		changelogTopic: changelog.TopicName(cfg.AppID),
		rebalanceWaits: make(chan struct{}, 1),
		restoreSlots:   make(chan struct{}, cfg.RestoreConcurrency),
		probes:         make(chan chan bool),
		sasl:           newSASLWatch(),
		clock:          cfg.Clock,
	}
	if cfg.StandbyReplicas > 0 {
		in.standbys = newStandbys(in)
	}
	if cfg.adaptsFetchBound() {
		in.fetchBound = newFetchBound(in.fetchPartitionBytes())
	}
	if in.clock == nil {
		in.clock = wallClock{}
	}
	if n, ok := in.clock.(interface{ NotifyAdvance(func()) }); ok {
		n.NotifyAdvance(in.wakeLoop)
	}
	m, cs := newMetrics(in)
	in.m = m
	if cfg.Sink != nil {
		sm, scs := newSinkMetrics()
		in.sinkM, cs = sm, append(cs, scs...)
	}
	if err := register(cfg.Registry, cs...); err != nil {
		return nil, err
	}
	in.collectors = cs
	return in, nil
}

// Close unregisters the instance's metrics from Options.Registry, so that
// another Instance can register its own there: a new configuration in the
// same process, with the same registry, and closes the job (Job.Close,
// which the function job uses to unregister its own). It does not stop Run (cancel
// Run's context for that, and wait for it to return): while Run runs,
// Close returns an error and does nothing. After Close, Run returns an
// error; a second Close does nothing. Run already closed the clients and
// state files it opened when it returned.
func (in *Instance) Close() error { return in.close(true) }

// close is Close; closeJob false leaves the job open, for a NewPipeline
// that refuses a later stage (its caller may give the jobs to another).
func (in *Instance) close(closeJob bool) error {
	in.closeMu.Lock()
	defer in.closeMu.Unlock()
	if in.closed {
		return nil
	}
	if !in.running.CompareAndSwap(false, true) {
		return errors.New("sluice: Close called while Run is running: cancel Run's context and wait for it to return first")
	}
	in.closed = true
	var errs []error
	if left := promreg.Unregister(in.cfg.Registry, in.collectors...); left > 0 {
		errs = append(errs, fmt.Errorf("sluice: Close: Options.Registry did not unregister %d of the instance's %d metric collectors", left, len(in.collectors)))
	}
	if closeJob && in.cfg.Job.Close != nil {
		if err := in.cfg.Job.Close(); err != nil {
			errs = append(errs, fmt.Errorf("sluice: Close: job %s: %w", in.cfg.Job.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Ready reports whether the instance is in its group, has received the
// session's first assignment, and every assigned task has restored and is
// running. Under a cooperative protocol (cooperative-sticky, KIP-848) a
// joining instance's first assignment can be empty while partitions move
// off other members: it is then ready, with no task, until the follow-up
// rebalance hands them over and their restores start.
func (in *Instance) Ready() bool { return in.ready.Load() }

// now is the wall clock of the instance, for what runs on real time
// whatever Options.Clock says: staleness of state files, their cleanup,
// fencing windows. Jobs see in.clock.
func (in *Instance) now() time.Time { return time.Now() }

// wakeLoop ends the loop's current poll, or makes its next one return at
// once: a restore finished, or a test clock moved.
func (in *Instance) wakeLoop() {
	in.woken.Store(true)
	in.wakeMu.Lock()
	if in.wake != nil {
		in.wake()
	}
	in.wakeMu.Unlock()
}

func (in *Instance) openTxnAge() float64 {
	at := in.txnOpenedAt.Load()
	if at == 0 {
		return 0
	}
	return time.Since(time.Unix(0, at)).Seconds()
}

func (in *Instance) baseOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(in.cfg.Brokers...),
		kgo.WithLogger(newKgoLogger(in.log)),
		kgo.ClientID("sluice-" + in.cfg.AppID + "-" + in.cfg.InstanceID),
		kgo.WithHooks(in.sasl),
	}
	return append(opts, in.cfg.ClientOpts...)
}

// Run runs the instance until ctx is cancelled, then ends with a final
// checkpoint and returns nil; it returns an error only for a condition a
// restart cannot fix by itself (bad topics, a failed local apply, a missing
// ACL: *PermissionError, refused credentials: *AuthError).
//
// Once Run has returned it may be called again (an in-process restart:
// the instance rejoins its group over the same state directory, and its
// metrics stay registered until Close); a call while Run is running, or
// after Close, returns an error.
func (in *Instance) Run(ctx context.Context) error {
	if !in.running.CompareAndSwap(false, true) {
		in.closeMu.Lock() // a Close under way has set closed once it lets go
		closed := in.closed
		in.closeMu.Unlock()
		if closed {
			return errors.New("sluice: Run called after Close")
		}
		return errors.New("sluice: Run called while the instance's Run is running; an instance runs once at a time (another instance needs New)")
	}
	defer in.running.Store(false)
	// What a Run before this one left behind that is not this Run's.
	in.unreleasedSince, in.sinkConflicts, in.kip848 = time.Time{}, nil, false
	in.missingTopic.Store(nil)
	if err := in.checkStateDir(); err != nil {
		return err
	}
	in.removeRestoreRuns()
	if in.cfg.RestoreFrom != "" {
		seed, err := in.openSeed(ctx)
		if err != nil {
			return err
		}
		in.seed = seed
		defer seed.sp.Close()
	}
	start := time.Now()
	if err := in.connect(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it got going
		}
		return err
	}
	in.log.Info("connected", "took", time.Since(start).Round(time.Millisecond).String(), "changelog", in.changelogTopic)
	defer in.admCl.Close()
	in.queries.connected(in.partitions, in.admCl, in.adm)
	defer in.queries.disconnected()
	ctl, err := in.followControl(ctx)
	if err != nil {
		return err
	}
	defer ctl.close()
	err = ctl.await(ctx, false, func(s control.State) {
		in.log.Info("the app is stopped (processor savepoint --stop); waiting for processor resume before joining the group", "request", s.ID, "since", s.At)
	})
	if err != nil {
		return nil
	}
	// A stop request ends the sessions as a shutdown does.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	in.standbys.start(runCtx)
	defer in.standbys.stop()
	var stopRequested atomic.Bool
	go func() {
		if ctl.await(runCtx, true, nil) == nil {
			in.log.Info("stop requested: taking a final checkpoint and leaving the group")
			stopRequested.Store(true)
			stopRun()
		}
	}()
	backoff := 250 * time.Millisecond
	var fenced []time.Time // ends of recently fenced sessions
	for {
		err := in.runSession(runCtx)
		if errors.Is(err, errKilled) {
			return nil
		}
		if runCtx.Err() != nil {
			in.leave(stopRequested.Load())
			return nil
		}
		if final := in.denied(ctx, err); final != nil {
			return final
		}
		if !errors.Is(err, errSessionBroken) {
			return err
		}
		// A session whose transaction outlived the transaction timeout
		// (a pause, a stall) was fenced by the broker's abort, not by
		// another process.
		expired := time.Duration(in.commitTxnAge.Swap(0)) > in.cfg.TransactionTimeout
		if isFenced(err) && !expired {
			now := in.now()
			window := fencedWindow * in.cfg.TransactionTimeout
			fenced = append(slices.DeleteFunc(fenced, func(at time.Time) bool { return now.Sub(at) > window }), now)
			if len(fenced) >= fencedSessionsLimit {
				return fmt.Errorf("%w: transactional id %q was fenced %d times within %s: give every instance its own SLUICE_INSTANCE_ID (last: %v)",
					ErrDuplicateInstance, in.cfg.transactionalID(), len(fenced), window, err)
			}
		}
		in.log.Warn("session ended; rebuilding it", "err", err, "backoff", backoff)
		if sleep(runCtx, backoff) != nil {
			in.leave(stopRequested.Load())
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// checkStateDir makes sure the state directory can be created and written
// before anything else: finding out at the first apply would stop the
// instance after it joined the group and took partitions.
func (in *Instance) checkStateDir() error {
	if in.cfg.Backend != "bbolt" {
		return nil
	}
	dir := in.stateDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("sluice: state dir %s cannot be created: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("sluice: state dir %s is not writable: %w", dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}

// connect waits for the brokers with backoff, then checks the topics and the
// transaction timeout.
func (in *Instance) connect(ctx context.Context) error {
	// Metadata answers are cached for MetadataMinAge (5s by default):
	// a topic just created would look empty that long.
	cl, err := kgo.NewClient(append(in.baseOpts(), kgo.MetadataMinAge(100*time.Millisecond))...)
	if err != nil {
		return fmt.Errorf("sluice: client: %w", err)
	}
	in.admCl, in.adm = cl, kadm.NewClient(cl)
	backoff := 250 * time.Millisecond
	for {
		err := in.prepare(ctx)
		if final := in.startupDenied(ctx, err); final != nil {
			cl.Close()
			return final
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			cl.Close()
			return ctx.Err()
		}
		var fatal *startupError
		var refused *RestoreError
		if errors.As(err, &fatal) || errors.As(err, &refused) {
			cl.Close()
			return err
		}
		in.log.Warn("cannot start yet (brokers unreachable or topics missing); retrying", "err", err, "retry_in", backoff)
		if sleep(ctx, backoff) != nil {
			cl.Close()
			return ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// startupError is a configuration problem found against the cluster;
// retrying does not help.
type startupError struct{ msg string }

func (e *startupError) Error() string { return e.msg }

func (in *Instance) prepare(ctx context.Context) error {
	// An unreachable cluster fails at once (connection refused); the
	// bound is for a reachable but slow one, and must leave a loaded
	// machine room to answer a handful of requests.
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	rctx, unbind := in.sasl.bind(rctx) // refused credentials end the attempt at once
	defer unbind()
	if in.cfg.Guarantee == ExactlyOnce {
		if err := in.checkTransactionTimeout(rctx); err != nil {
			return err
		}
	}
	topics, err := in.adm.ListTopics(rctx) // all: naming a missing topic makes the client retry it
	if err != nil {
		return err
	}
	var parts int32 = -1
	for _, t := range in.cfg.InputTopics {
		d, ok := topics[t]
		if !ok || d.Err != nil {
			return fmt.Errorf("input topic %s is not there yet: %v", t, d.Err)
		}
		n := int32(len(d.Partitions))
		if parts >= 0 && n != parts {
			return &startupError{fmt.Sprintf("input topics are not co-partitioned: %s has %d partitions, expected %d", t, n, parts)}
		}
		parts = n
	}
	in.partitions = parts
	if b := in.cfg.BroadcastTopic; b != "" {
		d, ok := topics[b]
		if !ok || d.Err != nil {
			return fmt.Errorf("broadcast topic %s is not there yet: %v", b, d.Err)
		}
		in.bcPartitions = int32(len(d.Partitions))
	}
	if in.seed != nil {
		if err := in.seed.checkPartitions(in.cfg.RestoreFrom, parts); err != nil {
			return err
		}
	}
	outParts := parts
	if in.cfg.Partitions > 0 {
		outParts = in.cfg.Partitions
	}
	info, err := changelog.Ensure(rctx, in.adm, in.changelogTopic, parts, !in.cfg.DisableTopicCreation)
	if err != nil {
		if errors.Is(err, changelog.ErrTopicMismatch) || errors.Is(err, changelog.ErrTopicMissing) {
			return &startupError{err.Error()}
		}
		return err
	}
	in.changelogInfo = info
	plain := []string{in.cfg.DLQTopic}
	if in.cfg.OutputTopic != "" {
		plain = append(plain, in.cfg.OutputTopic)
	}
	if in.cfg.forwardTopic != "" {
		plain = append(plain, in.cfg.forwardTopic)
	}
	for _, tag := range in.cfg.Job.SideOutputs {
		plain = append(plain, in.cfg.SideOutputTopics[tag])
	}
	if err := in.ensureTopics(rctx, outParts, plain...); err != nil {
		return err
	}
	if err := in.sizeBatches(rctx, plain); err != nil {
		return err
	}
	if in.hasControl, err = in.ensureControl(rctx); err != nil {
		return err
	}
	if s := in.cfg.Sink; s != nil {
		// Waited for like the brokers; a sink that cannot be used as
		// configured is final.
		if err := s.Setup(rctx); err != nil {
			if errors.Is(err, txsink.ErrSinkSetup) {
				return &startupError{err.Error()}
			}
			return fmt.Errorf("sink not reachable yet: %w", err)
		}
	}
	return in.prepareGroup(rctx)
}

// producerBatchMax is franz-go's default ProducerBatchMaxBytes.
const producerBatchMax = 1000012

// sizeBatches caps the producer's batches at the smallest max.message.bytes
// of the topics the instance writes. A broker refuses a batch above the
// topic's limit as a whole, so batches of small records that add up past it
// would fail forever, with no single record to blame.
func (in *Instance) sizeBatches(ctx context.Context, topics []string) error {
	in.batchMax = min(producerBatchMax, in.changelogInfo.MaxMessageBytes)
	rcs, err := in.adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return err
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			return fmt.Errorf("describe configs of %s: %w", rc.Name, rc.Err)
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if n, err := strconv.Atoi(*c.Value); err == nil && n > 0 {
				in.batchMax = min(in.batchMax, n)
			}
		}
	}
	return nil
}

func (in *Instance) ensureTopics(ctx context.Context, parts int32, topics ...string) error {
	have, err := in.adm.ListTopics(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for _, t := range topics {
		if d, ok := have[t]; !ok || d.Err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if in.cfg.DisableTopicCreation {
		return &startupError{fmt.Sprintf("topics %v do not exist and topic creation is off", missing)}
	}
	resp, err := in.adm.CreateTopics(ctx, parts, -1, nil, missing...)
	if err != nil {
		return err
	}
	for _, r := range resp {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", r.Topic, r.Err)
		}
	}
	return nil
}

// checkTransactionTimeout refuses to start when the broker would reject the
// transaction timeout at InitProducerID.
func (in *Instance) checkTransactionTimeout(ctx context.Context) error {
	rcs, err := in.adm.DescribeBrokerConfigs(ctx)
	if errors.Is(err, kerr.ClusterAuthorizationFailed) {
		// Not part of the least-privilege set (docs/security.md): the
		// broker checks the timeout itself at InitProducerID.
		in.log.Info("transaction timeout not checked against the broker: no DESCRIBE_CONFIGS on the cluster", "transaction_timeout", in.cfg.TransactionTimeout)
		return nil
	}
	if err != nil {
		return err
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "transaction.max.timeout.ms" || c.Value == nil {
				continue
			}
			maxMs, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				continue
			}
			if limit := time.Duration(maxMs) * time.Millisecond; in.cfg.TransactionTimeout > limit {
				return &startupError{fmt.Sprintf("SLUICE_TRANSACTION_TIMEOUT=%s exceeds the broker's transaction.max.timeout.ms (%s)", in.cfg.TransactionTimeout, limit)}
			}
			return nil
		}
	}
	return nil
}

// producerLinger is how long a partition's records wait for more before
// their batch is sent (newSession): franz-go's own default. It was 0, which
// sent smaller batches the slower a job produced: aggregate's outputs and
// changelog went out some 300 records a batch against the raw loop's
// 1,300, which doubled the broker's CPU per record on 2 cores shared with
// it (BENCHMARKS.md, settings). A commit flushes whatever lingers, so it
// costs no latency: outputs are visible only once their epoch commits.
const producerLinger = 10 * time.Millisecond

func (in *Instance) newSession() (txsink.Session, error) {
	// Callbacks are bound to this session's serial: the client starts
	// joining as soon as it is built, so its first assignment can arrive
	// before the loop runs, while a closed session's revoke (Close leaves
	// the group) can arrive after the next one began.
	serial := in.session.Add(1)
	record := func(kind string) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, cl *kgo.Client, ps map[string][]int32) {
			if kind == "assigned" {
				// Partitions given to us are paused at once: fetching
				// them starts only after their task has restored.
				cl.PauseFetchPartitions(ps)
			}
			in.evMu.Lock()
			in.ev = append(in.ev, event{kind, taskSet(ps), ps, serial})
			in.evMu.Unlock()
		}
	}
	// 64 KiB a partition in a fetch response to start with, times the
	// tasks processed at once (fetchPartitionBytes; franz-go's and
	// Kafka's default is 1 MiB), raised by fetchBound where it adapts:
	// with a few partitions, the records a
	// poll hands over were decoded shortly before and are still in the
	// CPU's caches, and a poll of MaxPollRecords mostly takes the whole
	// response, which sends the next fetch at once (franz-go fetches
	// again only once the last response was taken). Measured
	// (BENCHMARKS.md, settings chosen by measurement): against 1 MiB,
	// echo and aggregate some 15-30 % more records/s and a third of the
	// peak RSS; against 256 KiB, shorter checkpoints and a little more
	// throughput. A bound on the whole response would do the same, but
	// would fill a response with one partition, serialising tasks and
	// starving the other topics of a join (found by review). A batch
	// over the bound is returned only as the first of a response
	// (KIP-74), so a topic written in larger batches is read one batch a
	// response (make bench's input is; docs/operations.md#fetch-size),
	// and an instance whose polls must hold several partitions raises
	// the bound to the batches read (fetchBound). Before baseOpts, so
	// that Options.ClientOpts may override it, as it may the linger.
	asked, adapting := in.fetchPartitionBytes(), false
	if f := in.fetchBound; f != nil {
		asked, adapting = f.bound.Load(), f.adapting()
	}
	opts := append([]kgo.Opt{kgo.FetchMaxPartitionBytes(asked), kgo.ProducerLinger(producerLinger)}, in.baseOpts()...)
	if adapting {
		opts = append(opts, kgo.WithHooks(in.fetchBound), kgo.DisableFetchSessions())
	}
	opts = append(opts,
		kgo.ConsumeTopics(in.cfg.InputTopics...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A fetch waiting on idle partitions is not interrupted when a
		// restored task's partition resumes; franz-go's 5s default would
		// hold the new task back that long (Kafka's own default is 500ms).
		kgo.FetchMaxWait(250*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.BlockRebalanceOnPoll(),
		kgo.DisableAutoCommit(),
		kgo.RecordPartitioner(newPartitioner()),
		kgo.ProducerBatchMaxBytes(int32(in.batchMax)),
		kgo.MaxBufferedRecords(100000),
		kgo.OnPartitionsAssigned(record("assigned")),
		kgo.OnPartitionsRevoked(record("revoked")),
		kgo.OnPartitionsLost(record("lost")),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) {
			in.rebalanceWanted.Store(true)
			select {
			case in.rebalanceWaits <- struct{}{}:
			default:
			}
		}),
	)
	if len(in.cfg.InputTopics) > 1 {
		// Co-processing needs to see where a fetch went, markers
		// included (coInput.noteFetched, which drops them).
		opts = append(opts, kgo.KeepControlRecords())
	}
	opts = append(opts, in.groupOpts()...)
	newSession := txsink.NewAtLeastOnce
	if in.cfg.Guarantee == ExactlyOnce {
		opts = append(opts,
			kgo.TransactionalID(in.cfg.transactionalID()),
			kgo.TransactionTimeout(in.cfg.TransactionTimeout),
		)
		newSession = txsink.NewExactlyOnce
	}
	s, err := newSession(opts...)
	if err == nil && adapting {
		in.fetchBound.attach(s.Client(), asked)
	}
	return s, err
}

// takeEvents returns the current session's callbacks in the order they
// happened; those of earlier sessions are dropped.
func (in *Instance) takeEvents() []event {
	in.evMu.Lock()
	defer in.evMu.Unlock()
	cur := in.session.Load()
	ev := slices.DeleteFunc(in.ev, func(e event) bool { return e.serial != cur })
	in.ev = nil
	return ev
}

func taskSet(m map[string][]int32) []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, ps := range m {
		for _, p := range ps {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
