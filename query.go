package sluice

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/groupview"
	"github.com/sluicehq/sluice/kstate"
)

// Interactive queries (Kafka Streams' KafkaStreams.store, Flink's
// queryable state): a read of a key's state from outside the job, on the
// instance that runs the key's task. A query reads the task's backend,
// which holds only committed epochs: local state advances after the
// epoch's transaction commits, so a query never sees a write that a crash
// or an abort could still undo, and never one of an epoch whose outputs a
// read_committed consumer cannot see yet. Kafka Streams' stores serve
// uncommitted writes under exactly-once; these do not.

// ErrNotLocal is matched (errors.Is) by the *NotLocalError a query returns
// when the key's task does not run on this instance.
var ErrNotLocal = errors.New("sluice: the task does not run on this instance")

// NotLocalError says a query's task does not run here: another instance
// owns it (QueryOwner names it), or it is restoring here, or the instance
// is not running.
type NotLocalError struct {
	// Partition is the task's input partition; -1 when the instance has
	// not read its input's partition count (Run has not connected yet).
	Partition int32
	// Restoring says the task is assigned to this instance and restores
	// its state: ask again once it runs.
	Restoring bool
}

func (e *NotLocalError) Error() string {
	switch {
	case e.Partition < 0:
		return "sluice: query: the instance is not running (Run has not connected to the brokers, or has returned)"
	case e.Restoring:
		return fmt.Sprintf("sluice: query: task %d is restoring its state on this instance", e.Partition)
	}
	return fmt.Sprintf("sluice: query: task %d does not run on this instance", e.Partition)
}

// Is makes errors.Is(err, ErrNotLocal) true.
func (e *NotLocalError) Is(target error) bool { return target == ErrNotLocal }

// queries is what queries read from other goroutines than the loop's: the
// running tasks' backends by partition, and what routes a key to its task.
// The loop registers a task once it runs and drops it before it closes its
// backend; drop waits for the queries reading it, which hold no lock
// meanwhile, so a query's function may query again (the same task too).
type queries struct {
	parts atomic.Int32 // the input's partition count; 0 outside Run
	// now is the loop's last reading of a clock that is not the wall
	// clock (Options.Clock need not be safe for concurrent use), unix
	// milliseconds; the loop publishes it every iteration.
	now atomic.Int64

	mu        sync.Mutex
	running   map[int32]*queryTask
	restoring map[int32]bool
	standby   map[int32]*queryTask // standby replicas kept here, for QueryStale
	cl        *kgo.Client          // Run's admin client, for QueryOwner; nil outside Run
	adm       *kadm.Client
}

// queryTask is a running task's backend (or a standby's) and the queries
// reading it.
type queryTask struct {
	be     kstate.Backend
	mu     sync.Mutex
	reads  int           // queries in their function
	closed bool          // dropped: no new query reads it
	paused bool          // a standby's copy is cut between two markers: no new query reads it
	idle   chan struct{} // closed by the last read of a closed or paused task
}

// acquire counts a query in, unless the task was dropped or is paused.
func (t *queryTask) acquire() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.paused {
		return false
	}
	t.reads++
	return true
}

// pause refuses new queries until resume, and waits for those reading.
func (t *queryTask) pause() {
	t.mu.Lock()
	t.paused = true
	t.mu.Unlock()
	t.wait()
}

func (t *queryTask) resume() {
	t.mu.Lock()
	t.paused = false
	t.mu.Unlock()
}

func (t *queryTask) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reads--
	if t.reads == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// close refuses new queries and waits for those reading.
func (t *queryTask) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wait()
}

// wait returns once no query reads the task; new ones are refused.
func (t *queryTask) wait() {
	t.mu.Lock()
	var idle chan struct{}
	if t.reads > 0 {
		if t.idle == nil {
			t.idle = make(chan struct{})
		}
		idle = t.idle
	}
	t.mu.Unlock()
	if idle != nil {
		<-idle
	}
}

func (q *queries) connected(parts int32, cl *kgo.Client, adm *kadm.Client) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.parts.Store(parts)
	q.cl, q.adm = cl, adm
}

// disconnected ends Run's queries; the loop has dropped every task.
func (q *queries) disconnected() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.parts.Store(0)
	q.cl, q.adm = nil, nil
}

// restore marks task p as restoring here.
func (q *queries) restore(p int32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.restoring == nil {
		q.restoring = map[int32]bool{}
	}
	q.restoring[p] = true
}

// run makes task p's backend queryable. The loop calls it from an
// iteration, after it published now there: a query never judges TTLs by a
// clock not read yet.
func (q *queries) run(p int32, be kstate.Backend) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running == nil {
		q.running = map[int32]*queryTask{}
	}
	delete(q.restoring, p)
	q.running[p] = &queryTask{be: be}
}

// drop forgets task p; once it returns, no query reads its backend.
func (q *queries) drop(p int32) {
	q.mu.Lock()
	t := q.running[p]
	delete(q.running, p)
	delete(q.restoring, p)
	q.mu.Unlock()
	if t != nil {
		t.close()
	}
}

// standbyOn makes the standby replica of task p, whose copy is complete
// to an epoch, readable by QueryStale.
func (q *queries) standbyOn(p int32, be kstate.Backend) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.standby == nil {
		q.standby = map[int32]*queryTask{}
	}
	q.standby[p] = &queryTask{be: be}
}

// standbyCut says whether the standby replica of task p is about to hold
// a copy cut between two markers (a batch of a round that reads more
// than one): until it is whole again no query reads it, and cut waits for
// those reading. A copy cut between markers could show an at-least-once
// orphan, a value no epoch committed.
func (q *queries) standbyCut(p int32, cut bool) {
	q.mu.Lock()
	t := q.standby[p]
	q.mu.Unlock()
	switch {
	case t == nil:
	case cut:
		t.pause()
	default:
		t.resume()
	}
}

// standbyOff forgets task p's standby replica, as drop forgets a task.
func (q *queries) standbyOff(p int32) {
	q.mu.Lock()
	t := q.standby[p]
	delete(q.standby, p)
	q.mu.Unlock()
	if t != nil {
		t.close()
	}
}

// dropAll forgets every task, as drop does.
func (q *queries) dropAll() {
	q.mu.Lock()
	ts := q.running
	q.running = nil
	clear(q.restoring)
	q.mu.Unlock()
	for _, t := range ts {
		t.close()
	}
}

// task returns task p's entry, counted in (release it), or why there is
// none.
func (q *queries) task(p int32) (*queryTask, error) {
	t, _, err := q.taskOrStandby(p, false)
	return t, err
}

// taskOrStandby is task, falling back with stale to the standby replica of
// p kept here (standby true).
func (q *queries) taskOrStandby(p int32, stale bool) (t *queryTask, standby bool, err error) {
	n := q.parts.Load()
	if n <= 0 {
		return nil, false, &NotLocalError{Partition: -1}
	}
	if p < 0 || p >= n {
		return nil, false, fmt.Errorf("sluice: query: partition %d out of range: the input has %d", p, n)
	}
	q.mu.Lock()
	t, restoring, sb := q.running[p], q.restoring[p], q.standby[p]
	q.mu.Unlock()
	if t != nil && t.acquire() {
		return t, false, nil
	}
	if stale && sb != nil && sb.acquire() {
		return sb, true, nil
	}
	return nil, false, &NotLocalError{Partition: p, Restoring: restoring}
}

// PartitionOf returns key's task: the input partition Kafka's default
// partitioner (murmur2 of the key) sends key to, which Query reads. It is
// -1 before Run has connected to the brokers, and for the empty key.
func (in *Instance) PartitionOf(key []byte) int32 {
	n := in.queries.parts.Load()
	if len(key) == 0 || n <= 0 {
		return -1
	}
	return keyPartition(key, n)
}

// queryScope is the kstate.Scope a query's function reads through.
type queryScope struct {
	st  *kstate.Store
	key []byte
	now time.Time
}

func (s *queryScope) Store() *kstate.Store { return s.st }
func (s *queryScope) Key() []byte          { return s.key }
func (s *queryScope) Now() time.Time       { return s.now }

// Query reads key's state on this instance: it calls fn with a read-only
// scope of key over the committed state of the key's task, and the job's
// own state descriptors read through it, as in the job:
//
//	var total int64
//	err := inst.Query(key, func(s kstate.Scope) error {
//		v, _, err := count.Get(s)
//		total = v
//		return err
//	})
//
// The key's task is its input partition under Kafka's default partitioner
// (murmur2 of the key), as sluicetest and the built-in jobs' producers
// place keys; QueryPartition reads a task by number. If the task does not
// run on this instance, Query returns a *NotLocalError (errors.Is
// ErrNotLocal) and QueryOwner says which instance runs it.
//
// What fn reads is committed: every read returns the key's state as of an
// epoch that committed (at-least-once: whose offsets were committed),
// never a write of the open epoch. Two reads in one call may be of
// different epochs, when the task applies an epoch between them. Values
// with TTL that have expired read as absent, judged by the processing
// time (the loop's last reading of Options.Clock, when one is set); a
// read does not extend them. A write through the scope fails the query
// with an error wrapping kstate.ErrReadOnly (kstate.ErrBroadcastReadOnly
// for broadcast state) and changes nothing. A scan (a map's Entries, a
// value state's All) copies its range a chunk at a time before it calls
// its function.
//
// fn runs on the caller's goroutine while the task's store is held open:
// it should return promptly, since a rebalance that takes the task away,
// and the instance's shutdown, wait for it. It may query again (while a
// release of the task waits, such a query answers ErrNotLocal). It must
// not keep the scope, or slices read through it, past its return. Query
// is safe for concurrent use, also with Run; it reads only while Run runs.
func (in *Instance) Query(key []byte, fn func(kstate.Scope) error) error {
	if len(key) == 0 {
		return errors.New("sluice: query: an empty key has no partition under the default partitioner: use QueryPartition")
	}
	return in.QueryPartition(in.PartitionOf(key), key, fn)
}

// QueryPartition is Query for the task of input partition p, with key (may
// be empty) as the scope's key: for jobs whose producers place keys with
// another partitioner, and for reading state scoped to the empty key.
func (in *Instance) QueryPartition(p int32, key []byte, fn func(kstate.Scope) error) error {
	t, err := in.queries.task(p)
	if err != nil {
		return err
	}
	defer t.release()
	return in.read(t, p, key, func(_ int32, s kstate.Scope) error { return fn(s) })
}

// QueryStale is Query that, where the key's task does not run on this
// instance, reads the standby replica of it kept here
// (Options.StandbyReplicas; Kafka Streams' enableStaleStores): standby
// reports whether it did. A standby's state is committed too, as of the
// last epoch it applied, but it trails the running task by the epochs it
// has yet to read (a round every 200 ms while it keeps up, up to 2 s
// after a quiet spell; docs/operations.md#standby-replicas), so a key
// absent there may exist already. A standby is read only while its copy
// is whole to an epoch marker: one still reading its first copy, or
// applying a round of more than one batch, answers ErrNotLocal, as a task
// does that neither runs nor stands by here.
func (in *Instance) QueryStale(key []byte, fn func(kstate.Scope) error) (standby bool, err error) {
	if len(key) == 0 {
		return false, errors.New("sluice: query: an empty key has no partition under the default partitioner")
	}
	p := in.PartitionOf(key)
	t, standby, err := in.queries.taskOrStandby(p, true)
	if err != nil {
		return false, err
	}
	defer t.release()
	return standby, in.read(t, p, key, func(_ int32, s kstate.Scope) error { return fn(s) })
}

// StandbyLag is how far the standby replica of task p kept here was
// behind its changelog at its last round: the changelog offsets between
// its copy and the partition's last stable offset, 1 when caught up (the
// commit's control record follows the last marker), what a move of the
// task here would restore. ok is false when no standby of p runs here (or
// one the last assignment ended is stopping) or its lag is not known (before its first whole round, or while its
// rounds fail). Kafka Streams' allLocalStorePartitionLags has the same
// for its standbys; the sluice_standby_lag gauge shows it too.
func (in *Instance) StandbyLag(p int32) (lag int64, ok bool) {
	s := in.standbys
	if s == nil {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c, held := s.copies[p]
	if r := s.running[p]; r == nil || r.stopping || !held || c.Lag < 0 {
		return 0, false // none, or one the last assignment ended
	}
	return c.Lag, true
}

// QueryLocal calls fn for each task running on this instance, in
// partition order, with a read-only scope over its committed state as
// Query gives one (its key is empty): for reads across keys, such as a
// value state's All (Kafka Streams' store.all() on the local stores).
// Together, the instances' QueryLocal cover every task that runs; a task
// that moves during the call may be read on both instances or on neither,
// and a task restoring here is not read. If fn returns an error,
// QueryLocal stops and returns it. An instance that is not running returns
// a *NotLocalError with partition -1.
func (in *Instance) QueryLocal(fn func(task int32, s kstate.Scope) error) error {
	if in.queries.parts.Load() <= 0 {
		return &NotLocalError{Partition: -1}
	}
	in.queries.mu.Lock()
	ps := slices.Sorted(maps.Keys(in.queries.running))
	in.queries.mu.Unlock()
	for _, p := range ps {
		t, err := in.queries.task(p)
		if err != nil {
			continue // released meanwhile
		}
		err = func() error {
			defer t.release()
			return in.read(t, p, nil, fn)
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// read runs fn over task t's committed state, scoped to key.
func (in *Instance) read(t *queryTask, p int32, key []byte, fn func(int32, kstate.Scope) error) error {
	st := kstate.NewReadStore(t.be)
	err := fn(p, &queryScope{st: st, key: key, now: in.queryNow()})
	if err == nil {
		err = st.RecordErr()
	}
	return err
}

// queryNow is the processing time a query's TTLs are judged by: the wall
// clock's, or the loop's last reading of Options.Clock.
func (in *Instance) queryNow() time.Time {
	if _, wall := in.clock.(wallClock); wall {
		return time.Now()
	}
	return time.UnixMilli(in.queries.now.Load())
}

// Owner is the group member that runs a task, as the brokers describe the
// app's consumer group.
type Owner struct {
	// Partition is the task's input partition.
	Partition int32
	// InstanceID is the owner's Options.InstanceID (SLUICE_INSTANCE_ID);
	// "" when no member holds the task, as during a rebalance.
	InstanceID string
}

// QueryOwner returns the member of the app's consumer group that runs key's
// task (Kafka Streams' queryMetadataForKey): the instance to send a query
// to when this one answers ErrNotLocal. It asks the brokers each call (one
// describe of the group), so the answer is as of now; an assignment moves
// in a rebalance, and the owner may answer ErrNotLocal in turn. Its owner
// may be this instance, restoring the task. It works while Run runs.
func (in *Instance) QueryOwner(ctx context.Context, key []byte) (Owner, error) {
	if len(key) == 0 {
		return Owner{}, errors.New("sluice: query owner: an empty key has no partition under the default partitioner")
	}
	q := &in.queries
	q.mu.Lock()
	cl, adm := q.cl, q.adm
	q.mu.Unlock()
	p := in.PartitionOf(key)
	if p < 0 || cl == nil {
		return Owner{Partition: -1}, &NotLocalError{Partition: -1}
	}
	g, err := groupview.Describe(ctx, cl, adm, in.cfg.AppID)
	if err != nil {
		return Owner{Partition: p}, fmt.Errorf("sluice: query owner: %w", err)
	}
	topic := in.cfg.InputTopics[0]
	for _, m := range g.Members {
		if slices.Contains(m.Assigned[topic], p) {
			return Owner{Partition: p, InstanceID: m.InstanceID}, nil
		}
	}
	return Owner{Partition: p}, nil
}
