package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Mutation is one change to a backend entry.
type Mutation struct {
	Key   []byte
	Value []byte // nil deletes the key (a tombstone); empty is a value
}

// Meta is what a backend knows about its own progress. It is written in the
// same atomic transaction as the entries of the epoch it describes, so after
// any crash the entries and the meta agree: both at epoch E-1 or both at E.
type Meta struct {
	// Epoch is the last epoch applied.
	Epoch uint64
	// ChangelogOffset is the changelog offset just past the last applied
	// epoch marker: where a restore resumes reading. 0 (or -1) is the start.
	ChangelogOffset int64
	// Offsets maps each input topic to the next input offset of this task's
	// partition.
	Offsets map[string]int64
	// AppliedAt is the wall-clock time of the Apply that wrote this meta
	// (zero when unknown: files of older releases, fresh stores). A store
	// left alone longer than the changelog keeps tombstones may have missed
	// deletes, and must be restored from scratch instead.
	AppliedAt time.Time
	// Partial marks a restore in progress: the entries are a prefix of the
	// changelog up to ChangelogOffset, not a complete epoch, and Epoch and
	// Offsets are those of an older marker (or none). A restore that sorts
	// (changelog.RestoreParams.RunsDir) may also have put some keys at
	// values they take later in the log. Such a store must never run a
	// task; resuming the restore from ChangelogOffset completes it, since
	// every key ends at its last value in the log.
	Partial bool
	// Watermark is the task's event-time watermark as of Epoch (zero when
	// the task has none), kept so that it never moves back across a
	// restart.
	Watermark time.Time
	// SinkTxn is the outside sink's transaction of Epoch (txsink.TxnID,
	// "" when the epoch wrote nothing there), as its marker named it: a
	// restarted task recovers it (commits it if it is still prepared)
	// before it runs.
	SinkTxn string
}

// Clone returns a deep copy of m, so a caller's map is never shared with a
// backend.
func (m Meta) Clone() Meta {
	m.Offsets = maps.Clone(m.Offsets)
	if m.Offsets == nil {
		m.Offsets = map[string]int64{}
	}
	return m
}

// Stats describes a backend's contents for metrics.
type Stats struct {
	Keys  int64 // exact number of entries
	Bytes int64 // sum of key and value lengths (logical size, not file size)
	// HeapBytes estimates the Go heap the entries hold (see the memory
	// backend's entryHeap): several times Bytes for small entries. 0 for
	// bbolt, whose entries live in the mapped file and the page cache,
	// not in the heap.
	HeapBytes int64
	// EventTimers and ProcessingTimers count the timer entries of each
	// domain (see Timer), exactly: Apply sees whether each key existed
	// anyway, so a runtime gets its timer gauges without reading.
	EventTimers, ProcessingTimers int64
}

// Timers returns the timer count of domain d.
func (s Stats) Timers(d TimeDomain) int64 {
	if d == EventTime {
		return s.EventTimers
	}
	return s.ProcessingTimers
}

// count adds n entries of key (n is 1 or -1) to the timer counts if key
// is a timer's.
func (s *Stats) count(key []byte, n int64) {
	switch timerDomainOf(key) {
	case EventTime:
		s.EventTimers += n
	case ProcessingTime:
		s.ProcessingTimers += n
	}
}

// Backend is one task's durable key-value store: the state a Store overlays.
//
// A Backend has one writer at a time: Apply must not run concurrently with
// another Apply of the same Backend. (The engine calls it from a goroutine
// of its own, beside other tasks' Backends, while the task goes on with
// the next epoch: see Store.ApplyBehind.) Reads (Get, Scan, ScanFrom,
// Meta, Stats) may run from any goroutine, so metrics and savepoint
// exports can read while the task works, and Get may run while Apply
// does: it returns the entry as of before or after the Apply (bbolt's
// reads beside a write in a transaction of its own; the memory backend's
// waits for the write). A scan callback may call Get but must not call
// Apply, and Close must not run concurrently with any other call: a scan
// holds a read lock (or read transaction) while its callback runs. A scan
// whose callback calls Get must not run concurrently with an Apply either
// (the engine's scans never overlap its Applies): bbolt's Apply may wait
// for the scan's transaction to end while the callback's Get waits for the
// Apply.
type Backend interface {
	// Get returns the value stored under key. The returned slice is the
	// caller's to keep, but not to modify: it may share memory with other
	// values read.
	Get(key []byte) (value []byte, ok bool, err error)
	// Scan calls fn for every key with the prefix, in ascending byte order.
	// k and v are valid only during the call; copy them to keep them. If fn
	// returns ErrStopScan the scan ends and Scan returns nil; any other
	// error ends it and is returned.
	Scan(prefix []byte, fn func(k, v []byte) error) error
	// ScanFrom is Scan over the keys with the prefix that are >= start:
	// the first key considered is the smallest key >= start. A start
	// before the prefix's range (nil, say) scans all of it; one after
	// scans nothing. It costs one seek, not a walk over the keys before
	// start, which is what lets a bounded sweep resume where it stopped.
	ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error
	// Apply writes the mutations and the meta in one atomic transaction.
	// The mutations need not be sorted; Apply sorts them in place, so it
	// may reorder and overwrite the elements of muts (never the bytes they
	// point to). If a key appears more than once, the last mutation wins. Keys must be
	// non-empty and at most MaxKeySize bytes; otherwise nothing is written
	// and the error wraps ErrBadKey.
	Apply(muts []Mutation, meta Meta) error
	// Meta returns the meta of the last Apply, or for a fresh store a zero
	// Meta with an empty Offsets map.
	Meta() (Meta, error)
	// Stats returns the current key count (exact) and byte size.
	Stats() Stats
	// Close releases the backend. Calling it again returns nil; every other
	// method returns ErrClosed after it.
	Close() error
}

// BulkApplier is a Backend with a cheaper Apply for loading a store in many
// batches, as a restore from the changelog does.
type BulkApplier interface {
	// ApplyBulk is Apply, as atomic, but may leave unwritten what only
	// speeds up the next open (bbolt's freelist), so a crash before the
	// next Apply or Close makes that open slower: it reads every page.
	ApplyBulk(muts []Mutation, meta Meta) error
}

// Backend kinds accepted by Open and Remove.
const (
	BoltBackend   = "bbolt"
	MemoryBackend = "memory"
)

// Open opens the backend of the given kind for a task. A bbolt backend lives
// in filepath.Join(dir, task+".db"); a memory backend ignores dir and starts
// empty. The task name becomes a file name, so it must not be empty, ".",
// "..", or contain a path separator.
func Open(kind, dir, task string) (Backend, error) {
	if err := validateTask(task); err != nil {
		return nil, err
	}
	switch kind {
	case BoltBackend:
		return OpenBolt(BoltPath(dir, task))
	case MemoryBackend:
		return NewMemory(), nil
	}
	return nil, fmt.Errorf("%w %q (want %q or %q)", ErrUnknownBackend, kind, BoltBackend, MemoryBackend)
}

// Remove deletes a task's local state, for example when a restore must start
// over from the changelog. Removing state that does not exist is not an
// error; the memory backend keeps nothing on disk, so Remove is a no-op for
// it. The backend must be closed first.
func Remove(kind, dir, task string) error {
	if err := validateTask(task); err != nil {
		return err
	}
	switch kind {
	case BoltBackend:
		if err := os.Remove(BoltPath(dir, task)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kstate: remove task %q state: %w", task, err)
		}
		return nil
	case MemoryBackend:
		return nil
	}
	return fmt.Errorf("%w %q (want %q or %q)", ErrUnknownBackend, kind, BoltBackend, MemoryBackend)
}

// BoltPath is the file that holds a task's bbolt state in dir.
func BoltPath(dir, task string) string { return filepath.Join(dir, task+".db") }

func validateTask(task string) error {
	if task == "" || task == "." || task == ".." || filepath.Base(task) != task {
		return fmt.Errorf("kstate: invalid task name %q: must be a plain file name", task)
	}
	return nil
}

// prepareMutations sorts muts by key in place, drops all but the last
// mutation of each key and checks the keys. Both backends use it, so they
// agree on which inputs are valid and on what duplicates mean.
func prepareMutations(muts []Mutation) ([]Mutation, error) {
	for i := range muts {
		if err := checkKey(muts[i].Key); err != nil {
			return nil, err
		}
	}
	cmp := func(a, b Mutation) int { return bytes.Compare(a.Key, b.Key) }
	if !slices.IsSortedFunc(muts, cmp) {
		// Stable, so that among equal keys the caller's last one stays last.
		slices.SortStableFunc(muts, cmp)
	}
	out := muts[:0]
	for i := range muts {
		if i+1 < len(muts) && bytes.Equal(muts[i].Key, muts[i+1].Key) {
			continue
		}
		out = append(out, muts[i])
	}
	return out, nil
}

// scanStart is where a ScanFrom of prefix from start begins: the later of
// the two, since every key with the prefix is >= the prefix.
func scanStart(prefix, start []byte) []byte {
	if bytes.Compare(start, prefix) > 0 {
		return start
	}
	return prefix
}

func checkKey(key []byte) error {
	switch {
	case len(key) == 0:
		return fmt.Errorf("%w: empty key", ErrBadKey)
	case len(key) > MaxKeySize:
		return fmt.Errorf("%w: key of %d bytes exceeds MaxKeySize (%d)", ErrBadKey, len(key), MaxKeySize)
	}
	return nil
}
