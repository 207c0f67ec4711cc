package changelog

import (
	"bufio"
	"bytes"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/kstate"
)

// A restore with RestoreParams.RunsDir sorts before it applies, as Kafka
// Streams bulk-loads RocksDB during a restore. The changelog of a
// long-running app is in the order its keys were last written, which is
// random in the keys, and a B-tree takes keys in random order a page copy
// at a time: each batch of 10,000 random keys rewrote nearly every page of
// a task's tree.
//
// While every key read comes after the one before it (a changelog the job
// wrote in key order), batches are applied as they come: appends. From the
// first key out of order on, a batch is not applied but sorted and written
// to a file of RunsDir, a run. At the last marker the runs and the last
// batch are merged, the latest value of each key winning (tombstones kept:
// the backend may hold the key), and applied in key order, in batches of
// BatchKeys; into an empty backend these are appends, which bbolt takes
// without a lookup, into full pages.
//
// A run holds up to BatchBytes of entries (it has no pages to bound), so a
// merge reads few. At most maxRuns are kept: the next one merges them into
// the backend first, as does a run that cannot be written (a full disk),
// after which the restore goes on without sorting. On disk the runs take
// about the entries read up to the last marker, less the duplicates within
// each run; the directory is removed when the restore returns.
//
// A crash, an error or a cancellation during a merge leaves a backend
// holding the state at sortedFrom (a log prefix, as a Partial meta says)
// with some keys already at later values, each one a value the key takes
// later in the log. A restore from sortedFrom replays the log over it, and
// every such key ends at its last value in the log, so the result is the
// same.

// maxRuns bounds the runs a merge reads at once (open files, buffers).
const maxRuns = 64

// runEntryOverhead is what an entry of the batch costs beyond its key and
// value (its logEntry, and its Mutation when sorted): the bytes bound of a
// batch for a run counts it.
const runEntryOverhead = 104

// logEntry is an entry of the batch; seq is its place in the log among the
// batch's entries, the later of two writes of a key winning.
type logEntry struct {
	kstate.Mutation
	seq int
}

// slabFirst and slabChunk bound the size of slab's allocations: its first
// chunk is slabFirst bytes, each next one twice the last, up to slabChunk,
// so the short tail of a kept store does not cost a whole chunk.
const (
	slabFirst = 4 << 10
	slabChunk = 1 << 20
)

// slab hands out copies of keys and values from chunks of up to slabChunk
// bytes: one allocation a chunk, not one a key and one a value. Nothing is
// written over once handed out; a chunk is freed when nothing points into
// it any more.
type slab struct {
	buf  []byte
	next int // the size of the next chunk (0: slabFirst)
}

// copy returns a copy of b; non-nil even when b is empty, so an empty
// value does not turn into a tombstone.
func (s *slab) copy(b []byte) []byte {
	out := s.make(len(b))
	copy(out, b)
	return out
}

// make returns n bytes (non-nil) that nothing else refers to.
func (s *slab) make(n int) []byte {
	if s.buf == nil || cap(s.buf)-len(s.buf) < n {
		size := max(s.next, slabFirst)
		s.next = min(2*size, slabChunk)
		s.buf = make([]byte, 0, max(size, n))
	}
	at := len(s.buf)
	s.buf = s.buf[:at+n]
	return s.buf[at : at+n : at+n]
}

// noteOrder notes the key of a record read forward: whether keys still come
// in ascending order (if so, the batch is sorted as read).
func (r *restorer) noteOrder(key []byte) {
	if r.outOfOrder {
		return
	}
	if r.lastKey != nil && bytes.Compare(key, r.lastKey) <= 0 {
		r.outOfOrder = true
		return
	}
	r.lastKey = append(r.lastKey[:0], key...)
}

// sortedApply applies mutations handed to it in key order, in batches of at
// most BatchKeys keys and BatchBytes bytes (bbolt splits a node only when
// it commits): each batch but the last with a Partial meta at sortedFrom,
// where a restore after a crash in between resumes, the last with the meta
// finish is given.
type sortedApply struct {
	r    *restorer
	out  []kstate.Mutation // r.applyBuf's memory
	size int
}

func (r *restorer) sortedApply() sortedApply {
	return sortedApply{r: r, out: r.applyBuf[:0]}
}

func (a *sortedApply) add(m kstate.Mutation) error {
	if len(a.out) >= a.r.p.BatchKeys || a.size >= a.r.p.BatchBytes {
		if err := a.r.apply(a.out, a.r.partialMeta()); err != nil {
			return err
		}
		a.out, a.size = a.out[:0], 0
	}
	a.out = append(a.out, m)
	a.size += len(m.Key) + len(m.Value)
	return nil
}

func (a *sortedApply) finish(meta kstate.Meta) error {
	err := a.r.apply(a.out, meta)
	// Drop the references, keep the capacity; past len too, where the
	// batches add applied before this one left theirs.
	clear(a.out[:cap(a.out)])
	a.r.applyBuf = a.out[:0]
	if err != nil {
		return err
	}
	a.r.sortedFrom = meta.ChangelogOffset
	return nil
}

// applySorted applies muts, sorted by key, the last of its batches with
// meta (see sortedApply).
func (r *restorer) applySorted(muts []kstate.Mutation, meta kstate.Meta) error {
	a := r.sortedApply()
	for _, m := range muts {
		if err := a.add(m); err != nil {
			return err
		}
	}
	return a.finish(meta)
}

// partialMeta is the meta of a batch applied while sorting that does not
// leave the backend at a log prefix of its own: a restore resumes at
// sortedFrom.
func (r *restorer) partialMeta() kstate.Meta {
	return kstate.Meta{ChangelogOffset: r.sortedFrom, Partial: true, AppliedAt: time.Now()}
}

// apply applies one batch, unless the restore was cancelled: a merge
// applies a whole partition, and a task given away waits for it.
func (r *restorer) apply(muts []kstate.Mutation, meta kstate.Meta) error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if err := r.p.Apply(muts, meta); err != nil {
		return fmt.Errorf("changelog: apply restored batch: %w", err)
	}
	return nil
}

// runEntry is one entry of a run: a nil value is a tombstone.
type runEntry struct {
	key, val []byte
}

// writeRun writes entries, sorted by key, to a new file of dir.
func writeRun(dir string, n int, entries []kstate.Mutation) (string, error) {
	path := filepath.Join(dir, fmt.Sprintf("run-%06d", n))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("changelog: restore run: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<16)
	var hdr []byte
	for _, m := range entries {
		// key length, key, value length + 1 (0: a tombstone), value
		hdr = binary.AppendUvarint(hdr[:0], uint64(len(m.Key)))
		w.Write(hdr)
		w.Write(m.Key)
		vl := uint64(0)
		if m.Value != nil {
			vl = uint64(len(m.Value)) + 1
		}
		hdr = binary.AppendUvarint(hdr[:0], vl)
		w.Write(hdr)
		w.Write(m.Value)
	}
	err = w.Flush() // a bufio.Writer keeps its first error
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return "", fmt.Errorf("changelog: restore run %s: %w", path, err)
	}
	return path, nil
}

// runSource is one sorted input of the merge: a run file, or the last
// batch in memory. Later sources (higher order) hold later values.
type runSource struct {
	order int
	f     *os.File
	r     *bufio.Reader
	slab  *slab // the entries read from f
	mem   []kstate.Mutation
	cur   runEntry
}

// close closes a run file's source (at its end, or when the merge stops).
func (s *runSource) close() {
	if s.f != nil {
		s.f.Close()
	}
}

// next moves to the source's next entry; false at its end.
func (s *runSource) next() (bool, error) {
	if s.f == nil {
		if len(s.mem) == 0 {
			return false, nil
		}
		s.cur = runEntry{key: s.mem[0].Key, val: s.mem[0].Value}
		s.mem = s.mem[1:]
		return true, nil
	}
	kl, err := binary.ReadUvarint(s.r)
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	key := s.slab.make(int(kl))
	if _, err := io.ReadFull(s.r, key); err != nil {
		return false, err
	}
	vl, err := binary.ReadUvarint(s.r)
	if err != nil {
		return false, err
	}
	var val []byte
	if vl > 0 {
		val = s.slab.make(int(vl - 1))
		if _, err := io.ReadFull(s.r, val); err != nil {
			return false, err
		}
	}
	s.cur = runEntry{key: key, val: val}
	return true, nil
}

// sources is a heap of sources by their current key, the latest source
// first among equal keys.
type sources []*runSource

func (h sources) Len() int { return len(h) }
func (h sources) Less(i, j int) bool {
	if c := bytes.Compare(h[i].cur.key, h[j].cur.key); c != 0 {
		return c < 0
	}
	return h[i].order > h[j].order
}
func (h sources) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *sources) Push(x any)   { *h = append(*h, x.(*runSource)) }
func (h *sources) Pop() any {
	old := *h
	s := old[len(old)-1]
	*h = old[:len(old)-1]
	return s
}

// spill writes the batch as a run. With maxRuns runs already, or when the
// run cannot be written, the runs and the batch are merged into the
// backend instead, which then holds the log up to the batch's end (a
// Partial meta there); after a failed write the restore goes on without
// sorting.
func (r *restorer) spill(meta kstate.Meta) error {
	if len(r.runs) < maxRuns {
		path, err := writeRun(r.p.RunsDir, len(r.runs), r.sortedBatch())
		if err == nil {
			r.runs = append(r.runs, path)
			return nil
		}
		r.logf("cannot write a restore run; applying what was read so far and going on without sorting", "partition", r.p.Partition, "err", err)
		r.sorting = false
	}
	return r.mergeRuns(meta)
}

// mergeRuns applies the runs and the batch, merged, with meta on the last
// apply (the batch's own: the complete one that ends at the last marker,
// or a partial one), and removes the runs.
func (r *restorer) mergeRuns(meta kstate.Meta) error {
	h := make(sources, 0, len(r.runs)+1)
	var read slab
	defer func() {
		for _, s := range h {
			s.close()
		}
	}()
	for i := 0; i <= len(r.runs); i++ {
		s := &runSource{order: i}
		if i < len(r.runs) {
			f, err := os.Open(r.runs[i])
			if err != nil {
				return fmt.Errorf("changelog: restore run: %w", err)
			}
			s.f, s.r, s.slab = f, bufio.NewReaderSize(f, 1<<16), &read
		} else {
			s.mem = r.sortedBatch() // the latest
		}
		ok, err := s.next()
		if err != nil {
			s.close()
			return fmt.Errorf("changelog: read restore run: %w", err)
		}
		if !ok {
			s.close()
			continue
		}
		heap.Push(&h, s)
	}
	a := r.sortedApply()
	for h.Len() > 0 {
		e := h[0].cur
		// Older values of the same key, in earlier sources, are dropped.
		for {
			if err := r.advance(&h); err != nil {
				return err
			}
			if h.Len() == 0 || !bytes.Equal(h[0].cur.key, e.key) {
				break
			}
		}
		// A tombstone stays: the backend may hold the key.
		if err := a.add(kstate.Mutation{Key: e.key, Value: e.val}); err != nil {
			return err
		}
	}
	if err := a.finish(meta); err != nil {
		return err
	}
	for _, path := range r.runs {
		os.Remove(path)
	}
	r.runs = nil
	return nil
}

// advance moves the heap's first source to its next entry, or off the
// heap at its end.
func (r *restorer) advance(h *sources) error {
	s := (*h)[0]
	ok, err := s.next()
	if err != nil {
		return fmt.Errorf("changelog: read restore run: %w", err)
	}
	if ok {
		heap.Fix(h, 0)
		return nil
	}
	s.close()
	heap.Pop(h)
	return nil
}

// sortedBatch returns the batch as mutations sorted by key, one a key, its
// latest. While noteOrder has seen no key out of order the batch is in key
// order as read; otherwise it is sorted by key and place in the log, and
// only the last entry of each key is kept.
func (r *restorer) sortedBatch() []kstate.Mutation {
	muts := slices.Grow(r.muts[:0], len(r.ents)) // one mutation an entry at most: one allocation, not doublings
	ents := r.ents
	if r.outOfOrder && len(ents) > 1 {
		slices.SortFunc(ents, func(a, b logEntry) int {
			if c := bytes.Compare(a.Key, b.Key); c != 0 {
				return c
			}
			return a.seq - b.seq
		})
	}
	for i, e := range ents {
		if i+1 < len(ents) && bytes.Equal(e.Key, ents[i+1].Key) {
			continue // a later write of the key follows
		}
		muts = append(muts, e.Mutation)
	}
	r.muts = muts
	return muts
}

// growAfter is how many entries a batch holds before it is grown to the
// length its bounds will let it reach (batchLen) at once, rather than
// doubling: doubling copied each batch's entries some twice over, 9 % of
// a restore's CPU with half the changelog out of key order
// (BENCHMARKS.md, "State size and restore").
const growAfter = 1024

// batchLen is how many entries the batch will hold when it is flushed (see
// full), at the mean size of its entries so far: BatchKeys, or fewer if
// BatchBytes comes first (for a run, with what each entry costs beside its
// bytes); and no more than the records left to read can add, so that a
// short restore, which no RestoreConcurrency turn bounds, does not hold a
// batch sized for 16 MiB. Always at least one more than it holds.
func (r *restorer) batchLen() int {
	n := len(r.ents)
	mean := max(r.batchBytes/max(n, 1), 1) // rounded down: the flush comes no sooner
	var bound int
	if r.sorting && r.outOfOrder {
		bound = r.p.BatchBytes/(mean+runEntryOverhead) + 1
	} else {
		bound = min(r.p.BatchKeys, r.p.BatchBytes/mean+1)
	}
	left := n + 1 + int(max(0, r.end-r.pos))
	return max(n+1, min(bound, left))
}

// batchBufs are a restore's batch and its sorted mutations, kept for the
// next restore (a task's restore grows them to its batches' length, and
// an instance restores its tasks a few at a time).
type batchBufs struct {
	ents []logEntry
	muts []kstate.Mutation
}

var batchBufPool sync.Pool

func (r *restorer) takeBuffers() {
	if b, ok := batchBufPool.Get().(*batchBufs); ok {
		r.ents, r.muts = b.ents, b.muts
	}
}

// putBuffers gives the batch's buffers back for the next restore.
func (r *restorer) putBuffers() {
	if b := r.releaseBuffers(); b != nil {
		batchBufPool.Put(b)
	}
}

// releaseBuffers takes the batch's buffers from r, emptied and holding
// nothing they pointed to (the slab's chunks, the keys and values), or nil
// if it had none.
func (r *restorer) releaseBuffers() *batchBufs {
	ents, muts := r.ents[:cap(r.ents)], r.muts[:cap(r.muts)]
	clear(ents)
	clear(muts)
	r.ents, r.muts = nil, nil
	if cap(ents) == 0 && cap(muts) == 0 {
		return nil
	}
	return &batchBufs{ents: ents[:0], muts: muts[:0]}
}

func (r *restorer) clearBatch() {
	r.batchBytes = 0
	clear(r.muts) // drop the references, keep the capacity
	r.muts = r.muts[:0]
	clear(r.ents)
	r.ents = r.ents[:0]
}
