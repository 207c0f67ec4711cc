package sluice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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
		return "sluice: query: the instance is not running (Run has not connected to the brokers)"
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
// backend; a query holds the read lock while it reads, so a backend is
// never closed under it.
type queries struct {
	mu        sync.RWMutex
	parts     int32 // the input's partition count; 0 before Run connects
	running   map[int32]kstate.Backend
	restoring map[int32]bool
	cl        *kgo.Client // Run's admin client, for QueryOwner; nil outside Run
	adm       *kadm.Client
}

func (q *queries) connected(parts int32, cl *kgo.Client, adm *kadm.Client) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.parts, q.cl, q.adm = parts, cl, adm
}

func (q *queries) disconnected() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.parts, q.cl, q.adm = 0, nil, nil
	clear(q.running)
	clear(q.restoring)
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

// run makes task p's backend queryable.
func (q *queries) run(p int32, be kstate.Backend) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running == nil {
		q.running = map[int32]kstate.Backend{}
	}
	delete(q.restoring, p)
	q.running[p] = be
}

// drop forgets task p; once it returns, no query reads its backend.
func (q *queries) drop(p int32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.running, p)
	delete(q.restoring, p)
}

// dropAll forgets every task, as drop does.
func (q *queries) dropAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.running)
	clear(q.restoring)
}

// partition returns the task of key: the partition Kafka's default
// partitioner (murmur2 of the key) sends it to, -1 before Run connected.
func (q *queries) partition(key []byte) int32 {
	q.mu.RLock()
	n := q.parts
	q.mu.RUnlock()
	if n <= 0 {
		return -1
	}
	return partitionOf(key, n)
}

// partitionOf is the partition of n that Kafka's default partitioner
// gives a record with key (non-empty).
func partitionOf(key []byte, n int32) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: key}, int(n)))
}

// PartitionOf returns key's task: the input partition Kafka's default
// partitioner (murmur2 of the key) sends key to, which Query reads. It is
// -1 before Run has connected to the brokers, and for the empty key.
func (in *Instance) PartitionOf(key []byte) int32 {
	if len(key) == 0 {
		return -1
	}
	return in.queries.partition(key)
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
// epoch whose transaction committed, never a write of the open epoch. Two
// reads in one call may be of different epochs, when the task applies an
// epoch between them. Values with TTL that have expired read as absent
// (a read does not extend them). A write through the scope fails the
// query with an error wrapping kstate.ErrReadOnly and changes nothing.
//
// fn runs on the caller's goroutine while the task's store is held open:
// it must return promptly, since a rebalance that takes the task away
// waits for it. It must not keep the scope, or slices read through it,
// past its return. Query is safe for concurrent use, also with Run; it
// reads only while Run runs.
func (in *Instance) Query(key []byte, fn func(kstate.Scope) error) error {
	if len(key) == 0 {
		return errors.New("sluice: query: an empty key has no partition under the default partitioner: use QueryPartition")
	}
	return in.QueryPartition(in.queries.partition(key), key, fn)
}

// QueryPartition is Query for the task of input partition p, with key (may
// be empty) as the scope's key: for jobs whose producers place keys with
// another partitioner, and for reading state scoped to the empty key.
func (in *Instance) QueryPartition(p int32, key []byte, fn func(kstate.Scope) error) error {
	q := &in.queries
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.parts <= 0 {
		return &NotLocalError{Partition: -1}
	}
	if p < 0 || p >= q.parts {
		return fmt.Errorf("sluice: query: partition %d out of range: the input has %d", p, q.parts)
	}
	be := q.running[p]
	if be == nil {
		return &NotLocalError{Partition: p, Restoring: q.restoring[p]}
	}
	st := kstate.NewReadStore(be)
	err := fn(&queryScope{st: st, key: key, now: in.clock.Now()})
	if err == nil {
		err = st.RecordErr()
	}
	return err
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
	q.mu.RLock()
	parts, cl, adm := q.parts, q.cl, q.adm
	q.mu.RUnlock()
	if parts <= 0 || cl == nil {
		return Owner{Partition: -1}, &NotLocalError{Partition: -1}
	}
	p := partitionOf(key, parts)
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
