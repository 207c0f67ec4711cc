package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Store is a task's state as the task sees it: the backend overlaid with the
// epoch write-set and the writes of the record being processed.
//
//   - The epoch write-set holds every key changed in the current epoch, last
//     value wins. At the barrier Dirty lists it for the changelog; Apply
//     writes it to the backend only after the Kafka transaction committed,
//     and Discard drops it when the epoch aborts. The backend therefore only
//     ever holds committed epochs, which is why an abort needs no repair.
//   - A record's writes go straight into the epoch write-set, each key's
//     value before the record kept in an undo log: CommitRecord forgets
//     the log when the record succeeds, RollbackRecord puts the values back
//     when it fails, so a record sent to the dead-letter queue leaves no
//     trace in state. Writes made during a scan are held apart instead, in
//     the record write-set, so that the scan goes on over the state as it
//     was when it started; CommitRecord folds them in.
//
// Reads look at the record write-set, then the epoch write-set, then the
// write-set of an epoch sealed at its barrier and still committing (Seal),
// then the write-set of an epoch being applied behind (ApplyBehind), then
// the backend; a delete in a write-set hides the entries below it.
//
// Values written are copied into an arena of the epoch's, and keys into the
// write-set's own, so the hot path (a read and a write per record) makes no
// allocation of its own once the epoch has seen the key.
//
// A Store belongs to its task's goroutine and is not safe for concurrent use.
type Store struct {
	backend Backend
	epoch   *writeSet
	// sealed is the epoch before the current one, ended at its barrier
	// while its Kafka transaction commits (Seal), nil when none is:
	// ApplyBehind (or Apply) takes it once it committed, Discard drops it
	// with the current epoch when it did not.
	sealed *writeSet
	// behind is the committed epoch whose backend write runs on another
	// goroutine (ApplyBehind), nil when none does; spare is a write-set
	// that was behind, kept for the next epoch so a write-set's index is
	// not allocated anew every epoch.
	behind *behindApply
	spare  *writeSet
	// applyErr is the error of a write behind that failed, returned by
	// every later Settle, Apply and ApplyBehind; failed is that write's
	// write-set, committed but not in the backend, which the epoch
	// write-set holds from then on (see fold).
	applyErr error
	failed   *writeSet
	// record holds the writes made during a scan (nil value is a
	// tombstone); undo the epoch nodes the record changed directly, with
	// their values before it. gen numbers the records: a node whose gen
	// is the current one has its undo entry already.
	record    map[string][]byte
	undo      []undoEntry
	undoBytes []byte // the old values overwritten in place by the record (see clearRecord)
	gen       uint64
	scanning  int   // scans in progress (ScanFrom's callbacks may nest them)
	values    arena // copies of the epoch's written values
	recordErr error
	// maxEntry bounds len(key)+len(value) of a write (0 = no bound).
	maxEntry int
	// keyBuf is reused to build keys for point reads and writes, which do
	// not retain the key (writes copy it), so keyed state allocates no key
	// on the hot path. Scans build their own prefixes because callbacks may
	// do point operations while the scan still needs its prefix.
	keyBuf []byte
	// timerFloor is the earliest timer registered per domain (indexed by
	// TimeDomain) since the last TakeTimerFloor: an array, as the engine
	// takes it after every record.
	timerFloor [3]timerFloor
	// readOnly refuses every write (NewReadStore).
	readOnly bool
}

// NewStore returns a Store over b with empty write-sets.
func NewStore(b Backend) *Store {
	return &Store{backend: b, epoch: newWriteSet(), record: map[string][]byte{}, gen: 1}
}

// NewReadStore returns a Store that reads b and refuses writes: what a
// query reads a task's committed state through (sluice.Instance.Query),
// with the same state descriptors the job uses. A write through it (a
// Set, an Add, a timer) changes nothing and fails the Store: RecordErr
// returns an error wrapping ErrReadOnly. A value with TTL that has expired
// reads as absent, as in the job, but is not deleted, and a read does not
// push its expiry forward (OnReadAndWrite): the job's own reads and sweeps
// do that. Its reads may run beside the task's Applies (see Backend): a
// scan copies its range from the backend, a chunk at a time, before it
// calls its function, so that function may read state while an Apply
// waits. Like every Store, it
// is for one goroutine.
func NewReadStore(b Backend) *Store {
	return &Store{backend: readOnlyBackend{b}, epoch: newReadWriteSet(), gen: 1, readOnly: true}
}

// readOnlyBackend is a read store's backend: Apply and Close are refused,
// so nothing done through the store, or to the backend its Backend
// returns, writes or closes the task's backend.
type readOnlyBackend struct{ Backend }

func (readOnlyBackend) Apply([]Mutation, Meta) error { return ErrReadOnly }
func (readOnlyBackend) Close() error                 { return ErrReadOnly }

// maxUndoBytes is the undo buffer a Store keeps from one record to the
// next; a larger one (a record that wrote large values in place) is let go.
const maxUndoBytes = 64 << 10

// undoEntry is an epoch node's state before the current record changed it.
// For a value the record overwrote in place (Store.overwrite), orig is
// the node's buffer (never empty: an empty value is not written in place)
// and val a copy of its old bytes in the record's undo buffer, which a
// rollback writes back into it; orig is nil for any other entry.
type undoEntry struct {
	n     *wsNode
	val   []byte
	orig  []byte
	unset bool
}

// inPlace reports whether the record overwrote u's node in place.
func (u undoEntry) inPlace() bool { return u.orig != nil }

// size is what the node counted in the write-set's bytes before the record.
func (u undoEntry) size() int {
	if u.unset {
		return 0
	}
	return len(u.n.key) + len(u.val)
}

// Backend returns the backend the Store overlays.
func (s *Store) Backend() Backend { return s.backend }

// Get returns key's value as the current record sees it. The returned slice
// may be shared with the write-set: read it, do not modify it, and copy it
// to keep it past the next write of key, or the rollback of a record that
// wrote key (a write of a value of the same length may go over it in
// place, and its rollback puts the old bytes back there).
func (s *Store) Get(key []byte) ([]byte, bool, error) {
	if len(s.record) > 0 {
		if v, ok := s.record[string(key)]; ok {
			return v, v != nil, nil
		}
	}
	if n := s.epoch.get(key); n != nil {
		return n.val, n.val != nil, nil
	}
	if s.sealed != nil {
		if n := s.sealed.get(key); n != nil {
			return n.val, n.val != nil, nil
		}
	}
	if s.behind != nil {
		if n := s.behind.ws.get(key); n != nil {
			return n.val, n.val != nil, nil
		}
	}
	return s.backend.Get(key)
}

// Put sets key to a copy of value in the record write-set. A nil value is
// stored as an empty one (nil is reserved for deletes).
//
// A key the backend could not store (empty, or longer than MaxKeySize) is not
// written; the error is kept for RecordErr so the record fails before it can
// reach the changelog, instead of the epoch failing after its commit.
func (s *Store) Put(key, value []byte) {
	if err := s.checkEntry(key, value); err != nil {
		s.fail(err)
		return
	}
	if !s.overwrite(key, value) {
		s.write(key, s.values.copy(value))
	}
}

// write sets key to val (nil deletes), which the Store owns, for the
// current record.
func (s *Store) write(key, val []byte) {
	if s.readOnly {
		s.fail(ErrReadOnly)
		return
	}
	if s.scanning > 0 {
		s.record[string(key)] = val
		return
	}
	if len(s.record) > 0 {
		delete(s.record, string(key)) // this write is newer
	}
	n := s.epoch.node(key)
	if n == nil {
		n = s.epoch.insert(key)
	}
	if n.gen != s.gen {
		s.undo = append(s.undo, undoEntry{n: n, val: n.val, unset: n.unset})
		n.gen = s.gen
	}
	s.epoch.assign(n, val)
	n.own = val != nil
}

// overwrite writes val over key's value in the epoch write-set, in place,
// and reports whether it could: when the epoch's value for key is a
// non-empty buffer of the node's own (written earlier in the epoch, this
// record included, and shared with nothing) of val's length, and nothing
// has taken the write-set's values yet (Dirty). A hot key's writes then
// reuse one buffer for the epoch instead of each taking new arena bytes
// (-bench EpochBytes: a 256-byte value written in 60 % of the time, with
// a sixth of the new memory; BENCHMARKS.md). The old bytes go to the
// record's undo buffer first, for a rollback. The caller has checked the
// entry (checkEntry).
func (s *Store) overwrite(key, val []byte) bool {
	if len(val) == 0 || s.scanning > 0 || len(s.record) > 0 || s.epoch.shared {
		return false
	}
	n := s.epoch.node(key)
	if n == nil || !n.own || len(n.val) != len(val) {
		return false
	}
	if n.gen != s.gen {
		at := len(s.undoBytes)
		s.undoBytes = append(s.undoBytes, n.val...)
		old := s.undoBytes[at:len(s.undoBytes):len(s.undoBytes)]
		s.undo = append(s.undo, undoEntry{n: n, val: old, orig: n.val})
		n.gen = s.gen
	}
	copy(n.val, val)
	return true
}

// SetMaxEntryBytes bounds the size of one entry (key plus value); 0 lifts
// the bound. The engine sets it below the changelog topic's
// max.message.bytes, so a value the changelog would refuse fails its record
// (which goes to the dead-letter topic) instead of every commit.
func (s *Store) SetMaxEntryBytes(n int) { s.maxEntry = n }

func (s *Store) checkEntry(key, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if s.maxEntry > 0 && len(key)+len(value) > s.maxEntry {
		return fmt.Errorf("%w: an entry of %d bytes exceeds the limit of %d (the changelog's max.message.bytes)", ErrValueTooLarge, len(key)+len(value), s.maxEntry)
	}
	return nil
}

// Delete removes key in the record write-set. Invalid keys are handled as
// in Put.
func (s *Store) Delete(key []byte) {
	if err := checkKey(key); err != nil {
		s.fail(err)
		return
	}
	s.write(key, nil)
}

// putOwned is Put for a value the caller built and will not touch again,
// saving the copy.
func (s *Store) putOwned(key, value []byte) {
	if err := s.checkEntry(key, value); err != nil {
		s.fail(err)
		return
	}
	s.writeOwned(key, value)
}

// writeOwned is putOwned for an entry already checked.
func (s *Store) writeOwned(key, value []byte) {
	if value == nil {
		value = []byte{}
	}
	s.write(key, value)
}

// Fail marks the record being processed as failed: RecordErr returns err
// (or an earlier failure), so the record goes to the dead-letter topic even
// if the job ignored the cause. The engine uses it for an output it cannot
// route.
func (s *Store) Fail(err error) { s.fail(err) }

func (s *Store) fail(err error) {
	if s.recordErr == nil {
		s.recordErr = err
	}
}

// RecordErr returns the first write of the current record that was refused
// (see Put), or nil. A caller that sees an error must treat the record as
// failed and call RollbackRecord; CommitRecord would commit the record's
// other writes without the refused one.
func (s *Store) RecordErr() error { return s.recordErr }

// CommitRecord keeps the record's writes in the epoch write-set.
func (s *Store) CommitRecord() {
	// Ranging over a map costs an iterator even when it is empty, which
	// it is for every record that did not write during a scan: a few
	// per cent of a stateless job's CPU.
	if len(s.record) > 0 {
		for k, v := range s.record {
			s.epoch.set(k, v)
		}
	}
	s.clearRecord()
}

// RollbackRecord undoes the record's writes.
func (s *Store) RollbackRecord() {
	for i := len(s.undo) - 1; i >= 0; i-- {
		u := s.undo[i]
		switch {
		case u.unset:
			s.epoch.unassign(u.n)
		case u.inPlace():
			s.epoch.assign(u.n, u.orig)
			copy(u.orig, u.val)
			u.n.own = true
		default:
			s.epoch.assign(u.n, u.val)
		}
	}
	s.clearRecord()
}

func (s *Store) clearRecord() {
	if len(s.record) > 0 {
		clear(s.record)
	}
	if len(s.undo) > 0 {
		clear(s.undo) // the nodes may belong to an epoch about to be dropped
		s.undo = s.undo[:0]
		s.undoBytes = s.undoBytes[:0]
		if cap(s.undoBytes) > maxUndoBytes {
			s.undoBytes = nil // one record's large values are not kept for the next
		}
	}
	s.gen++
	s.recordErr = nil
}

// recordInFlight reports whether the current record wrote anything or
// failed: it has neither committed nor rolled back.
func (s *Store) recordInFlight() bool {
	return len(s.record) > 0 || len(s.undo) > 0 || s.recordErr != nil
}

// Dirty returns the epoch write-set as mutations sorted by key: one per key
// changed in the epoch (by records that committed), holding its last
// value, nil for a delete. The
// mutations share the write-set's bytes; do not modify them. From then on
// no write goes over the epoch's values in place. (For a record in flight
// that wrote a value in place, the mutation holds a copy of the old bytes;
// the record's rollback puts them back into the node's buffer, which no
// mutation holds.)
func (s *Store) Dirty() []Mutation {
	s.epoch.shared = true
	var before map[*wsNode]undoEntry // the current record's nodes, if any
	if len(s.undo) > 0 {
		before = make(map[*wsNode]undoEntry, len(s.undo))
		for _, u := range s.undo {
			before[u.n] = u
		}
	}
	muts := make([]Mutation, 0, s.DirtyLen())
	for n := s.epoch.first(); n != nil; n = n.after() {
		val := n.val
		if u, ok := before[n]; ok {
			if u.unset {
				continue
			}
			val = u.val
			if u.inPlace() {
				val = bytes.Clone(val) // the undo buffer is the record's
			}
		}
		muts = append(muts, Mutation{Key: n.kb, Value: val})
	}
	return muts
}

// DirtyLen returns the number of keys changed in the epoch (by records
// that committed).
func (s *Store) DirtyLen() int {
	n := s.epoch.len()
	for _, u := range s.undo {
		if u.unset && !u.n.unset {
			n--
		}
	}
	return n
}

// EpochMemory returns the bytes the epoch's write-set may keep alive: its
// values' arena (whole chunks) and the slabs its keys and nodes took this
// epoch (not the nodes an epoch before left for its hot keys, at most 4
// MiB: see writeSet.reset). When most
// writes overwrite a few keys it is far above DirtyBytes, since a chunk
// lives as long as any value in it; the engine ends an epoch early when
// either reaches Options.EpochMaxBytes.
func (s *Store) EpochMemory() int {
	return s.values.held + s.epoch.held()
}

// DirtyBytes returns the key and value bytes of the epoch's changes (by
// records that committed).
func (s *Store) DirtyBytes() int {
	b := s.epoch.bytes
	for _, u := range s.undo {
		b -= u.n.size() - u.size()
	}
	return b
}

// Rewrite marks key changed in the epoch with its committed value (a delete
// if the backend has none), unless the epoch changed it already. The engine
// uses it for keys whose last changelog record is not a committed one.
// Call it between records: with a record in flight it returns an error.
func (s *Store) Rewrite(key []byte) error {
	if s.recordInFlight() {
		return errRecordInFlight
	}
	if s.epoch.get(key) != nil {
		return nil
	}
	v, ok, err := s.committed(key)
	if err != nil {
		return err
	}
	switch {
	case !ok:
		v = nil
	case v == nil:
		v = []byte{}
	}
	s.epoch.set(string(key), v)
	return nil
}

// committed returns key's value as of the last committed epoch: the
// epoch applied behind, if it changed the key, else the backend.
func (s *Store) committed(key []byte) ([]byte, bool, error) {
	for _, ws := range [2]*writeSet{s.behindSet(), s.failed} {
		if ws != nil {
			if n := ws.get(key); n != nil {
				return n.val, n.val != nil, nil
			}
		}
	}
	return s.backend.Get(key)
}

// behindSet is the write-set of the write behind, nil if none runs.
func (s *Store) behindSet() *writeSet {
	if s.behind == nil {
		return nil
	}
	return s.behind.ws
}

// Apply writes dirty, the epoch's Dirty exactly as it went to the
// changelog, and meta to the backend in one atomic transaction, then clears
// the write-set. Taking the changelog's slice rather than reading the
// write-set again keeps the backend equal to the changelog by construction
// (and copies the keys once per epoch, not twice). Call it only after the
// epoch's Kafka transaction committed, between records (with a record in
// flight it returns an error). On error the write-set is kept, so the
// caller may retry.
//
// With an epoch sealed (Seal), it is the sealed epoch that is applied and
// dropped, and the current one stays.
func (s *Store) Apply(dirty []Mutation, meta Meta) error {
	if s.recordInFlight() {
		return errRecordInFlight
	}
	if err := s.Settle(); err != nil {
		return err
	}
	if err := s.backend.Apply(dirty, meta); err != nil {
		return err
	}
	if s.sealed != nil {
		s.dropSealed()
		return nil
	}
	s.resetEpoch()
	return nil
}

// dropSealed drops the sealed epoch, if any, keeping its write-set as the
// spare.
func (s *Store) dropSealed() {
	if s.sealed != nil {
		s.sealed.reset()
		s.spare, s.sealed = s.sealed, nil
	}
}

// Seal ends the epoch at its barrier while its transaction commits, so
// that the next epoch's records can be processed meanwhile (the engine's
// pipelined epochs): the epoch write-set is set aside as the sealed one and
// a fresh one starts over it. Reads see the sealed epoch under the new one.
// Once the sealed epoch committed, ApplyBehind (or Apply) takes it; if it
// did not, Discard drops it with the epoch after it. Call it between
// records, with no epoch sealed already.
func (s *Store) Seal() error {
	switch {
	case s.recordInFlight():
		return errRecordInFlight
	case s.sealed != nil:
		return errors.New("kstate: an epoch is sealed already")
	}
	s.sealed = s.epoch
	s.newEpoch()
	return nil
}

// newEpoch starts a fresh epoch write-set (the spare one, if any) once the
// current one was set aside; its values stay where they are.
func (s *Store) newEpoch() {
	if s.spare != nil {
		s.epoch, s.spare = s.spare, nil
	} else {
		s.epoch = newWriteSet()
	}
	s.clearRecord()
	s.values = arena{}
}

// Sealed reports whether an epoch is sealed (Seal) and not yet applied or
// discarded.
func (s *Store) Sealed() bool { return s.sealed != nil }

// behindApply is an epoch's backend write under way on another goroutine.
type behindApply struct {
	ws   *writeSet
	done chan struct{} // closed when the write returned
	err  error         // the write's error, once done is closed
}

// ApplyBehind is Apply without the wait: it takes the epoch write-set
// aside (the sealed one, if an epoch is sealed: see Seal), starts a fresh
// one for the next epoch (or keeps the current one), and hands start the
// backend write (dirty and meta in one transaction, as Apply), which
// start runs on a goroutine of its own (or at once). Until the write
// returns, reads see the epoch taken aside under the new one, so the task
// goes on processing the next epoch while its backend catches up; the
// backend's Get may therefore run while its Apply does, which the Backend
// contract allows.
//
// Settle (or TrySettle) ends it. Scans, Apply and the next ApplyBehind
// settle first: the engine's scans never overlap its Applies (see
// Backend). Call it only after the epoch's Kafka transaction committed,
// between records; with a record in flight it returns an error. An
// earlier write's error is returned without starting this one.
func (s *Store) ApplyBehind(dirty []Mutation, meta Meta, start func(write func())) error {
	if s.recordInFlight() {
		return errRecordInFlight
	}
	if err := s.Settle(); err != nil {
		return err
	}
	// The sealed epoch goes behind, and the current one goes on; without
	// one, the current epoch goes behind and a fresh one starts.
	ws := s.sealed
	if ws == nil {
		ws = s.epoch
		s.newEpoch()
	}
	s.sealed = nil
	b := &behindApply{ws: ws, done: make(chan struct{})}
	s.behind = b
	backend := s.backend
	start(func() {
		b.err = backend.Apply(dirty, meta)
		close(b.done)
	})
	return nil
}

// Settle waits for the write ApplyBehind started, if any, and returns its
// error. Once it succeeded the backend holds the epoch and reads go to it
// again. If it failed, the backend is still at the epoch before, and the
// epoch's writes move into the current epoch's write-set wherever the
// current epoch did not change the key (see fold), there to stay: a
// Discard folds them in again, and Rewrite reads them as committed. So
// reads stay as they were, and the error is returned by every later
// Settle, Apply and ApplyBehind. It may be called mid-record (a scan
// does).
func (s *Store) Settle() error {
	if s.behind == nil {
		return s.applyErr
	}
	<-s.behind.done
	return s.settled()
}

// TrySettle is Settle without the wait: if the write ApplyBehind started
// has yet to return, it reports false.
func (s *Store) TrySettle() (bool, error) {
	if s.behind == nil {
		return true, s.applyErr
	}
	select {
	case <-s.behind.done:
		return true, s.settled()
	default:
		return false, nil
	}
}

// Behind reports whether a write started by ApplyBehind has yet to be
// settled.
func (s *Store) Behind() bool { return s.behind != nil }

func (s *Store) settled() error {
	b := s.behind
	s.behind = nil
	if b.err != nil {
		s.fold(b.ws)
		s.applyErr, s.failed = b.err, b.ws
		return b.err
	}
	b.ws.reset()
	s.spare = b.ws
	return nil
}

// fold moves a committed epoch's write-set, whose backend write failed,
// under the current epoch's: each of its keys the current epoch did not
// change is set to its value, so reads see what they saw with the epoch
// behind, and the next Apply writes it. A key a sealed epoch changed is
// left out: that value is newer (Discard folds again once it is dropped). A record in flight that created a
// key's node (its undo entry says unset) would, when rolled back, fall
// through to the backend, which lacks the epoch: its undo entry takes the
// committed value instead.
func (s *Store) fold(ws *writeSet) {
	for n := ws.first(); n != nil; n = n.after() {
		if s.sealed != nil && s.sealed.get(n.kb) != nil {
			continue
		}
		e := s.epoch.node(n.kb)
		switch {
		case e == nil:
			s.epoch.set(n.key, n.val)
		case e.unset:
			s.epoch.assign(e, n.val)
		}
	}
	for i := range s.undo {
		u := &s.undo[i]
		if u.unset && (s.sealed == nil || s.sealed.get(u.n.kb) == nil) {
			if n := ws.get(u.n.kb); n != nil {
				u.val, u.unset = n.val, false
			}
		}
	}
}

// resetEpoch empties the epoch write-set. Its bytes may still be in use
// (the changelog's records, values a job kept), so the arena starts anew
// rather than being reused.
func (s *Store) resetEpoch() {
	s.clearRecord()
	s.epoch.reset()
	s.values = arena{}
}

// Discard drops the write-sets, the sealed epoch's too (see Seal): the
// epoch aborted, and the backend already holds the state the task rewinds
// to (or is being written with it: ApplyBehind). After a write behind
// failed, the epoch it lacks is folded into the new epoch write-set again.
func (s *Store) Discard() {
	s.resetEpoch()
	s.dropSealed()
	if s.failed != nil {
		s.fold(s.failed)
	}
}

// Scan calls fn for every key with the prefix as the current record sees it,
// in ascending byte order: write-set values replace backend values, deletes
// hide them. k and v are valid only during the call. fn may call Get, Put
// and Delete (the scan goes on over the state as it was when it started) but
// not CommitRecord, RollbackRecord, Apply or Discard. If fn returns
// ErrStopScan the scan ends and Scan returns nil.
func (s *Store) Scan(prefix []byte, fn func(k, v []byte) error) error {
	return s.ScanFrom(prefix, prefix, fn)
}

// ScanFrom is Scan over the keys with the prefix that are >= start, with
// the same merge of write-sets and backend and the same rules for fn. A
// start before the prefix's range (nil, say) scans all of it. Each level
// seeks to start, so the keys before it cost nothing (the record
// write-set, a handful of keys, is filtered instead).
func (s *Store) ScanFrom(prefix, start []byte, fn func(k, v []byte) error) error {
	if s.readOnly {
		return s.scanCopy(prefix, start, fn)
	}
	// A write behind settles first: the backend's scan must not overlap
	// its Apply (see Backend). Its error is the next Settle's to report;
	// the state read here is whole either way (see Settle).
	_ = s.Settle()
	from := scanStart(prefix, start)
	// The write-sets are read up front (the record's range is copied, and
	// while a scan runs writes go to the record write-set, not the epoch's
	// skip list: see write), so fn's own writes do not disturb the merge:
	// the scan goes on over the state as it was when it started.
	ov := overlay{prefix: string(prefix), records: s.recordRange(prefix, from), node: s.epoch.seek(from, string(prefix))}
	if s.sealed != nil {
		ov.sealed = s.sealed.seek(from, string(prefix))
	}
	s.scanning++
	defer func() { s.scanning-- }()
	stopped := false
	call := func(k, v []byte) error {
		err := fn(k, v)
		if err == ErrStopScan {
			stopped = true
		}
		return err
	}
	// emit hands one overlay entry to fn, skipping tombstones.
	emit := func(e overlayEntry) error {
		if e.val == nil {
			return nil
		}
		return call([]byte(e.key), e.val)
	}
	err := s.backend.ScanFrom(prefix, from, func(k, v []byte) error {
		for {
			e, ok := ov.peek()
			if !ok || e.key > string(k) {
				return call(k, v)
			}
			ov.advance()
			if e.key == string(k) {
				return emit(e) // the write-set shadows the backend
			}
			if err := emit(e); err != nil {
				return err
			}
		}
	})
	if err != nil || stopped {
		return err
	}
	for e, ok := ov.peek(); ok; e, ok = ov.peek() {
		ov.advance()
		if err := emit(e); err != nil {
			if err == ErrStopScan {
				return nil
			}
			return err
		}
	}
	return nil
}

// recordRange returns the record write-set's entries under prefix that are
// >= from, sorted. The record write-set holds a handful of keys, so sorting
// on demand is cheaper than keeping it ordered.
func (s *Store) recordRange(prefix, from []byte) []overlayEntry {
	if len(s.record) == 0 {
		return nil
	}
	p, f := string(prefix), string(from)
	var out []overlayEntry
	for k, v := range s.record {
		if strings.HasPrefix(k, p) && k >= f {
			out = append(out, overlayEntry{key: k, val: v})
		}
	}
	slices.SortFunc(out, func(a, b overlayEntry) int { return strings.Compare(a.key, b.key) })
	return out
}

// appendKey builds a key in the Store's reusable buffer. The result is valid
// until the next appendKey; use it only for point reads and writes.
func (s *Store) appendKey(kind Kind, name string, userKey, sub []byte) []byte {
	s.keyBuf = AppendKey(s.keyBuf[:0], kind, name, userKey, sub)
	return s.keyBuf
}

type overlayEntry struct {
	key string
	val []byte // nil is a tombstone
}

// overlay merges the record write-set range, the epoch write-set range and
// the sealed epoch's range (see Seal) into one ordered stream; on equal keys
// the record's entry wins over the epoch's, and the epoch's over the sealed
// one's.
type overlay struct {
	prefix  string
	records []overlayEntry
	node    *wsNode
	sealed  *wsNode
}

func (o *overlay) peek() (overlayEntry, bool) {
	var e overlayEntry
	found := false
	// From the lowest level up, so that an equal key above replaces it.
	for _, n := range [2]*wsNode{o.sealed, o.node} {
		if n.within(o.prefix) && (!found || n.key <= e.key) {
			e, found = overlayEntry{key: n.key, val: n.val}, true
		}
	}
	if len(o.records) > 0 && (!found || o.records[0].key <= e.key) {
		e, found = o.records[0], true
	}
	return e, found
}

// advance moves past the key peek returns, at every level that has it.
func (o *overlay) advance() {
	e, ok := o.peek()
	if !ok {
		return
	}
	if len(o.records) > 0 && o.records[0].key == e.key {
		o.records = o.records[1:]
	}
	if o.node.within(o.prefix) && o.node.key == e.key {
		o.node = o.node.afterWithin(o.prefix)
	}
	if o.sealed.within(o.prefix) && o.sealed.key == e.key {
		o.sealed = o.sealed.afterWithin(o.prefix)
	}
}

// scanCopy is a read store's ScanFrom: it copies the range from the
// backend a chunk at a time and calls fn after each chunk, so that fn
// never runs inside the backend's scan. A query's scan runs beside the
// task's Apply (the engine's own scans never do): a callback that read
// state inside the backend's scan could wait for that Apply while the
// Apply waited for the scan. Chunks bound the copy, and how long a bbolt
// read transaction holds back an Apply that grows the file; each chunk may
// see a later epoch than the one before. A read store's write-sets are
// empty, so the backend is all there is.
func (s *Store) scanCopy(prefix, start []byte, fn func(k, v []byte) error) error {
	const chunkEntries, chunkBytes = 1024, 1 << 20
	from := scanStart(prefix, start)
	var buf []byte
	var ends []int // the end of each key, then of its value, in buf
	for {
		buf, ends = buf[:0], ends[:0]
		full := false
		err := s.backend.ScanFrom(prefix, from, func(k, v []byte) error {
			buf = append(buf, k...)
			ends = append(ends, len(buf))
			buf = append(buf, v...)
			ends = append(ends, len(buf))
			if len(ends)/2 >= chunkEntries || len(buf) >= chunkBytes {
				full = true
				return ErrStopScan
			}
			return nil
		})
		if err != nil {
			return err
		}
		at := 0
		var last []byte
		for i := 0; i < len(ends); i += 2 {
			k, v := buf[at:ends[i]:ends[i]], buf[ends[i]:ends[i+1]:ends[i+1]]
			at, last = ends[i+1], k
			if err := fn(k, v); err != nil {
				if err == ErrStopScan {
					return nil
				}
				return err
			}
		}
		if !full {
			return nil
		}
		// The next chunk begins just past the last key: the smallest key
		// above it. A new slice: fn may keep last, and buf is reused.
		from = append(slices.Clip(last), 0)
	}
}
