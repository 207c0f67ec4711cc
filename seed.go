package sluice

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/savepoint"
)

// Seeding a new app from a savepoint (Options.RestoreFrom).
//
// A task whose changelog partition holds no epoch marker is seeded before
// its ordinary restore: its part of the savepoint goes to its changelog
// partition in transactions of its own, the last of which ends with a marker
// carrying the savepoint's offsets, epoch and watermark. The ordinary
// restore then reads it like any changelog, into whichever backend the
// instance runs (which is how a savepoint switches backends), and
// processing resumes at the marker's offsets.
//
// Ordering rules:
//   - A task whose changelog has a marker is never seeded: restoring twice,
//     or leaving SLUICE_RESTORE_FROM set, seeds nothing more.
//   - The producer that seeds partition p (transactional id
//     <app>-restore-<p>) is initialised before the changelog is read, and
//     the same producer writes: a previous owner still seeding, or about to
//     (paused between its read and its first write, or revoked but not yet
//     told), is fenced and can commit nothing after this read, so the
//     decision "no marker" stays true until this seeding writes its own.
//     (Fencing with one producer and writing with another would let the
//     paused owner's own initialisation fence this one back later.)
//   - Entries an unfinished seeding left (committed, with no marker after
//     them) are orphans: each gets a tombstone before the savepoint's
//     entries, so that nothing but the savepoint survives compaction.
//   - The marker goes in the last transaction, after every entry: a crash
//     before it leaves orphans for the next attempt, never a marker over
//     half the state.

// Seeding transactions stay well inside the transaction timeout and the
// broker's memory: a large task is written in several.
const (
	seedTxnRecords = 20000
	seedTxnBytes   = 16 << 20
)

// RestoreError says why Options.RestoreFrom cannot seed this app: a
// savepoint of another job, state the job does not declare, offsets of an
// input it no longer reads, fewer partitions than the savepoint has. Run
// returns it before connecting; the binary prints it as its one line.
type RestoreError struct {
	Location string // Options.RestoreFrom
	Reason   string
}

func (e *RestoreError) Error() string {
	return fmt.Sprintf("restore from savepoint %s: %s", e.Location, e.Reason)
}

// seedSource is the savepoint an app seeds its tasks from, checked against
// the job once at start.
type seedSource struct {
	sp   *savepoint.Savepoint
	drop map[string]bool // state names dropped (AllowNonRestoredState)
	// dropTimers: the savepoint has timers and the job no OnTimer.
	dropTimers bool
	inputs     map[string]bool // the savepoint's input topics that the app still reads
}

// openSeed opens and verifies Options.RestoreFrom and checks it against the
// job. Mismatches are a *RestoreError, unless AllowNonRestoredState lets the
// state in question be dropped.
func (in *Instance) openSeed(ctx context.Context) (*seedSource, error) {
	loc := in.cfg.RestoreFrom
	sp, err := savepoint.Open(ctx, loc)
	if err != nil {
		return nil, &RestoreError{loc, err.Error()}
	}
	if err := sp.Verify(ctx); err != nil {
		sp.Close()
		return nil, &RestoreError{loc, err.Error()}
	}
	m := sp.Manifest
	job := in.cfg.Job
	if err := in.checkStages(m); err != "" {
		sp.Close()
		return nil, &RestoreError{loc, err}
	}
	if m.Job != "" && m.Job != job.Name {
		sp.Close()
		return nil, &RestoreError{loc, fmt.Sprintf("it holds the state of job %q, this instance runs job %q", m.Job, job.Name)}
	}
	src := &seedSource{sp: sp, drop: map[string]bool{}, inputs: map[string]bool{}}
	var unknown []string
	operatorDropped := false
	for _, s := range m.States {
		switch {
		case s.Name == kstate.PositionState:
			// The engine's own (broadcast.go): it goes with the
			// broadcast tables, never on its own.
		case s.Kind == kstate.KindTimer.String():
			if job.OnTimer == nil {
				src.dropTimers = true
				unknown = append(unknown, "timers (the job has no OnTimer)")
			}
		case len(job.States) > 0 && !slices.Contains(job.States, s.Name):
			src.drop[s.Name] = true
			unknown = append(unknown, fmt.Sprintf("%s state %q", s.Kind, s.Name))
			operatorDropped = operatorDropped || s.Kind == kstate.KindOperator.String()
		}
	}
	hasPositions := slices.ContainsFunc(m.States, func(s savepoint.State) bool { return s.Name == kstate.PositionState })
	switch {
	case hasPositions && job.OnBroadcast == nil:
		// Positions in a broadcast stream the job no longer reads.
		src.drop[kstate.PositionState] = true
	case hasPositions && operatorDropped:
		// Dropping a broadcast table but keeping the task's position
		// (or the reverse) would leave a table that is not the stream's
		// up to the position: never done, even when asked.
		sp.Close()
		return nil, &RestoreError{loc, fmt.Sprintf("it holds broadcast positions and operator state job %q does not declare (%s); a broadcast job's savepoint restores with all its operator state or not at all", job.Name, strings.Join(unknown, ", "))}
	}
	for _, t := range m.Inputs {
		if in.cfg.purgeInput && t.Topic == m.AppID+"-repartition" {
			// A later stage of a pipeline: its savepoint's input is the
			// old app's repartition topic, drained when the savepoint
			// was taken (processor savepoint --stop checks it), and this
			// stage's own starts where its log does (cut).
			continue
		}
		if slices.Contains(in.cfg.InputTopics, t.Topic) {
			src.inputs[t.Topic] = true
		} else {
			unknown = append(unknown, fmt.Sprintf("offsets of input topic %q", t.Topic))
		}
	}
	if len(unknown) > 0 {
		what := strings.Join(unknown, ", ")
		if !in.cfg.AllowNonRestoredState {
			sp.Close()
			return nil, &RestoreError{loc, fmt.Sprintf("it holds %s, which job %q does not declare (its states: %s; inputs: %s); SLUICE_ALLOW_NON_RESTORED_STATE=true drops them",
				what, job.Name, strings.Join(job.States, ", "), strings.Join(in.cfg.InputTopics, ", "))}
		}
		in.log.Warn("restoring without state the job does not declare", "savepoint", loc, "dropped", what)
	}
	if len(job.States) == 0 && len(m.States) > 0 {
		in.log.Warn("the job declares no States: the savepoint's state names are not checked against it", "savepoint", loc, "job", job.Name)
	}
	return src, nil
}

// checkStages refuses a pipeline's savepoint for anything but the first
// stage of a pipeline of the same stages, and the reverse; it says why, or
// "".
func (in *Instance) checkStages(m savepoint.Manifest) string {
	var names []string
	for _, st := range m.Stages {
		names = append(names, st.Name)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(in.cfg.pipelineStages))
	switch {
	case in.cfg.pipelineStages == nil && names != nil:
		return fmt.Sprintf("it is the savepoint of a pipeline (its later stages: %s): restore it into a pipeline of the same stages (NewPipeline; the binary: the same SLUICE_JOB)", strings.Join(names, ", "))
	case in.cfg.pipelineStages != nil && names == nil:
		return fmt.Sprintf("it is the savepoint of one job, %q, not of a pipeline (its later stages here: %s)", m.Job, strings.Join(want, ", "))
	case in.cfg.pipelineStages != nil && !slices.Equal(names, want):
		return fmt.Sprintf("it holds a pipeline whose later stages are %s; this pipeline's are %s", strings.Join(names, ", "), strings.Join(want, ", "))
	}
	return ""
}

// checkPartitions refuses a savepoint of more partitions than the input has:
// the offsets of its extra partitions would have no task.
func (s *seedSource) checkPartitions(loc string, parts int32) error {
	if n := int32(len(s.sp.Manifest.Tasks)); n > parts {
		return &RestoreError{loc, fmt.Sprintf("it has %d tasks, the input has %d partitions: a savepoint restores into as many partitions or more", n, parts)}
	}
	return nil
}

// seedID is the transactional id that seeds partition p.
func (in *Instance) seedID(p int32) string {
	return fmt.Sprintf("%s-restore-%d", in.cfg.AppID, p)
}

// seedClient is the producer that seeds partition p, its producer id
// initialised: from now on every earlier seeder of p is fenced, whether it
// is writing or about to (see the ordering rules above).
func (in *Instance) seedClient(ctx context.Context, p int32) (*kgo.Client, error) {
	cl, err := kgo.NewClient(append(in.baseOpts(),
		kgo.TransactionalID(in.seedID(p)),
		kgo.TransactionTimeout(in.cfg.TransactionTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(int32(in.batchMax)),
		kgo.ProducerLinger(0),
	)...)
	if err != nil {
		return nil, fmt.Errorf("seed task %d: client: %w", p, err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("seed task %d: initialise %s: %w", p, in.seedID(p), err)
	}
	return cl, nil
}

// seedTask writes task p's part of the savepoint to its changelog
// partition with cl (seedClient), after a tombstone for each orphan an
// unfinished seeding left.
func (in *Instance) seedTask(ctx context.Context, cl *kgo.Client, p int32, orphans [][]byte) error {
	start := time.Now()
	cut, err := in.seed.cut(ctx, in, p)
	if err != nil {
		return err
	}
	w := seedWriter{ctx: ctx, cl: cl, topic: in.changelogTopic, p: p, header: changelog.EncodeEpoch(cut.Epoch)}
	for _, k := range orphans {
		if err = w.add(k, nil); err != nil {
			break
		}
	}
	var keys int64
	if err == nil {
		err = in.seed.scan(ctx, p, in.partitions, func(k, v []byte) error {
			keys++
			return w.add(k, v)
		})
	}
	if err == nil {
		err = w.add(changelog.MarkerKey, changelog.EncodeMarker(cut))
	}
	if err == nil {
		err = w.commit()
	}
	if err != nil {
		w.abort()
		return fmt.Errorf("seed task %d from savepoint: %w", p, err)
	}
	in.log.Info("task seeded from savepoint", "task", p, "savepoint", in.cfg.RestoreFrom, "keys", keys, "orphans", len(orphans),
		"epoch", cut.Epoch, "offsets", cut.Offsets, "transactions", w.txns, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// cut is the marker that ends task p's seeding. Without a rescale it is the
// savepoint task's own cut. After a rescale, an old partition keeps its
// offsets (the partitions that existed keep their numbers and records),
// a new one starts at its log start; the epoch is the largest of the
// savepoint, and the watermark the least, so that no timer fires early.
func (s *seedSource) cut(ctx context.Context, in *Instance, p int32) (changelog.Marker, error) {
	m := changelog.Marker{Job: in.cfg.Job.Name, Offsets: map[string]int64{}}
	tasks := s.sp.Manifest.Tasks
	rescaled := int32(len(tasks)) != in.partitions
	for _, t := range tasks {
		if t.Partition == p {
			for topic, off := range t.Offsets {
				if s.inputs[topic] {
					m.Offsets[topic] = off
				}
			}
			if !rescaled {
				m.Epoch, m.Watermark = t.Epoch, t.WatermarkTime()
			}
		}
		if rescaled {
			m.Epoch = max(m.Epoch, t.Epoch)
			if wm := t.WatermarkTime(); !wm.IsZero() && (m.Watermark.IsZero() || wm.Before(m.Watermark)) {
				m.Watermark = wm
			}
		}
	}
	var missing []string
	for _, topic := range in.cfg.InputTopics {
		if _, ok := m.Offsets[topic]; !ok {
			missing = append(missing, topic)
		}
	}
	if len(missing) > 0 {
		// New partitions and new input topics start where their log
		// does, as a new app's would.
		starts, err := in.adm.ListStartOffsets(ctx, missing...)
		if err != nil {
			return m, fmt.Errorf("seed task %d: list start offsets: %w", p, err)
		}
		for _, topic := range missing {
			o, ok := starts.Lookup(topic, p)
			if !ok || o.Err != nil {
				return m, fmt.Errorf("seed task %d: start offset of %s/%d: %v", p, topic, p, o.Err)
			}
			m.Offsets[topic] = o.Offset
		}
	}
	return m, nil
}

// scan calls fn with every savepoint entry that belongs to task p of parts,
// in the order of the savepoint's data files. Without a rescale that is
// task p's own file. After one, every file is read and an entry goes where
// the input partitioner (Kafka's default, murmur2 over the record key) now
// sends its key, and the state of the empty key stays with its partition
// number. Operator lists (kstate.OperatorList) go to one task each, the
// one of the writer's number modulo the new count; union lists
// (kstate.UnionList) go to every task, rescaled or not, as Flink restores
// them. Task p's copy of the broadcast table (kstate.Broadcast) and its
// position in the broadcast stream come from old task p modulo the old
// count, together.
func (s *seedSource) scan(ctx context.Context, p, parts int32, fn func(k, v []byte) error) error {
	tasks := s.sp.Manifest.Tasks
	rescaled := int32(len(tasks)) != parts
	unions := slices.ContainsFunc(s.sp.Manifest.States, func(st savepoint.State) bool { return st.Kind == kstate.KindOperator.String() })
	probe := &kgo.Record{}
	for _, t := range tasks {
		own := rescaled || t.Partition == p
		if !own && !unions {
			continue
		}
		// A union list's restore is the concatenation of every old
		// task's whole list, as in Flink: what a task holds under every
		// writer's entry (its own, and the copies an earlier union
		// restore gave it) goes out as one entry per old task, so that
		// the old tasks' lists cannot overwrite each other.
		union := map[string][]byte{}
		err := s.sp.Scan(ctx, t, func(k, v []byte) error {
			key, err := kstate.DecodeKey(k)
			if err != nil {
				return err
			}
			if s.drop[key.Name] && key.Kind != kstate.KindTimer || s.dropTimers && key.Kind == kstate.KindTimer {
				return nil
			}
			if key.Kind == kstate.KindOperator {
				mode, writer, err := kstate.OperatorEntry(key)
				if err != nil {
					return err
				}
				switch mode {
				case kstate.OperatorUnion:
					union[key.Name] = append(union[key.Name], v...)
				case kstate.OperatorBroadcast, kstate.OperatorPosition:
					// A copy of the broadcast table and how far in
					// the stream it is: one task's pair, whole.
					if t.Partition == p%int32(len(tasks)) {
						return fn(k, v)
					}
				default:
					if writer%parts == p {
						return fn(k, v)
					}
				}
				return nil
			}
			if !own {
				return nil
			}
			if rescaled {
				owner := t.Partition
				recordKey := key.UserKey
				if key.Kind == kstate.KindTimer {
					// A timer's record key is in its tail.
					tm, err := kstate.DecodeTimer(k)
					if err != nil {
						return err
					}
					recordKey = tm.Key
				}
				if len(recordKey) > 0 {
					probe.Key = recordKey
					owner = int32(byKey.Partition(probe, int(parts)))
				}
				if owner != p {
					return nil
				}
			}
			return fn(k, v)
		})
		for _, name := range slices.Sorted(maps.Keys(union)) {
			if err != nil {
				break
			}
			err = fn(kstate.UnionEntryKey(name, t.Partition), union[name])
		}
		if err != nil {
			return fmt.Errorf("savepoint task %d: %w", t.Partition, err)
		}
	}
	return nil
}

// seedWriter writes one task's seeding to its changelog partition in
// transactions bounded by seedTxnRecords and seedTxnBytes.
type seedWriter struct {
	ctx    context.Context
	cl     *kgo.Client
	topic  string
	p      int32
	header []byte

	open    bool
	records int
	bytes   int
	txns    int
	failed  atomic.Pointer[error] // the open transaction's first failed produce
}

func (w *seedWriter) add(k, v []byte) error {
	if !w.open {
		if err := w.cl.BeginTransaction(); err != nil {
			return err
		}
		w.open, w.records, w.bytes = true, 0, 0
	}
	// The caller's bytes are valid only during the call; a nil value
	// stays nil: it is a tombstone.
	rec := &kgo.Record{Topic: w.topic, Partition: w.p, Key: slices.Clone(k),
		Headers: []kgo.RecordHeader{{Key: changelog.EpochHeader, Value: w.header}}}
	if v != nil {
		rec.Value = slices.Clone(v)
	}
	// Never cancelled: a record failed by its own context is not sent,
	// and the flush below must see every record's outcome.
	w.cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
		if err != nil {
			w.failed.CompareAndSwap(nil, &err)
		}
	})
	w.records++
	w.bytes += len(k) + len(v)
	if w.records >= seedTxnRecords || w.bytes >= seedTxnBytes {
		return w.commit()
	}
	return nil
}

// commit ends the open transaction once every record in it is
// acknowledged; a record that failed aborts it instead.
func (w *seedWriter) commit() error {
	if !w.open {
		return nil
	}
	if err := w.cl.Flush(w.ctx); err != nil {
		return err
	}
	if perr := w.failed.Load(); perr != nil {
		return fmt.Errorf("produce to %s/%d: %w", w.topic, w.p, *perr)
	}
	w.open = false
	if err := w.cl.EndTransaction(w.ctx, kgo.TryCommit); err != nil {
		return err
	}
	w.txns++
	return nil
}

// abort ends an open transaction without committing it. Closing the client
// would leave it to the transaction timeout, or to the next seeder's fence.
func (w *seedWriter) abort() {
	if !w.open {
		return
	}
	w.open = false
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.cl.AbortBufferedRecords(ctx); err == nil {
		w.cl.EndTransaction(ctx, kgo.TryAbort)
	}
}
