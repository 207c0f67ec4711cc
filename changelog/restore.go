package changelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/kstate"
)

// RestoreParams says which changelog partition to restore and where to put it.
type RestoreParams struct {
	// Admin lists offsets and the group's committed offsets.
	Admin *kadm.Client
	// ClientOpts connect the client the restore fetches with: seed
	// brokers, TLS, SASL, logging. It consumes nothing (see
	// partitionReader).
	ClientOpts []kgo.Opt
	// Client, if set, is the client the restore fetches with instead of
	// one built from ClientOpts: a standby's rounds share one. Restore
	// does not close it.
	Client    *kgo.Client
	Topic     string
	Partition int32
	// From is the backend's stored changelog offset: just past the last
	// epoch marker it applied, or for a partial restore just past the last
	// record it applied.
	From int64
	// Group and InputTopics name the consumer group and the task's input
	// topics, for the check that the group's stable offsets agree with the
	// last marker. An empty Group skips the check.
	Group       string
	InputTopics []string
	// Live reads a partition that a running task is writing, for a
	// standby replica: up to its last stable offset as it is when the
	// round begins, without waiting for the open transaction to end, and
	// everything up to the last marker below it is applied. Group is
	// ignored: the group's offsets move on with the running task. The
	// entries after that marker are not orphans but the start of the
	// next round (Result.Next is where it begins); Result.Orphans is
	// left empty.
	Live bool
	// Applied, if set, is the last marker the backend applied (its epoch
	// and offsets), so a restore that finds nothing new still knows them.
	Applied *Marker
	// BatchKeys bounds how many records (entries, a key written twice
	// counting twice) are held in memory before they are applied,
	// whatever the markers. Default 10,000 (see DefaultBatchKeys).
	BatchKeys int
	// BatchBytes bounds the key and value bytes held in memory before
	// they are applied, so that large values cannot make a batch of
	// BatchKeys records large. Default 16 MiB.
	BatchBytes int
	// RunsDir, if set, makes the restore sort what it reads before it
	// applies it, in files of this directory (see runs.go): far faster
	// into bbolt when the changelog is not in key order. The directory
	// must be the restore's own: Restore deletes it when it starts and
	// when it returns. Sorting is correct over a backend that holds state
	// too; it gains most over an empty one.
	RunsDir string
	// Apply writes a batch to the backend in one atomic step with meta:
	// complete (Partial false: every epoch up to the marker in meta) or a
	// prefix of the changelog (Partial true).
	Apply func(muts []kstate.Mutation, meta kstate.Meta) error
	// Admit, if set, is called at most once: before the restore reads on
	// from its position, the first time more than BatchKeys records
	// (offsets) lie between that position and the partition's end. A
	// restore that will hold a batch waits there for its turn (the
	// engine's Options.RestoreConcurrency), while the short tail of a
	// store that was kept goes ahead. The restore calls the returned
	// release when it returns, after it has removed its runs; a restore
	// that waits on the broker (an open transaction, a broker that is
	// down) keeps its turn meanwhile.
	Admit func(ctx context.Context, records int64) (release func(), err error)
	// Progress, if set, is told the records read and the records that
	// remain to the partition's end.
	Progress func(done, remaining int64)
	// Logf, if set, receives notable events (waiting on an open
	// transaction, a group ahead of the changelog).
	Logf func(msg string, args ...any)
}

// Result is what a restore found.
type Result struct {
	Records int64   // changelog records read
	Last    *Marker // last complete epoch's marker, nil if the partition has none
	Next    int64   // changelog offset just past Last's marker (the next From)
	// End is the offset the read went to: the partition's end, for a
	// live read its last stable offset. End - Next is how far the state
	// lags what the changelog had committed.
	End int64
	// Orphans are the keys of entries after the last marker: written by an
	// attempt that never wrote its marker (at-least-once), so not part of
	// the state. The task must write each again with its restored value
	// before its next marker, so that compaction cannot keep an orphan as
	// the key's last record.
	Orphans [][]byte
}

// ErrGroupAhead is returned (wrapped) when the consumer group's committed
// offsets stay ahead of the changelog's last marker: an epoch committed its
// offsets without its state, which means the changelog topic was replaced
// or truncated under the app. Reset the app rather than guess.
var ErrGroupAhead = errors.New("changelog: consumer group offsets are ahead of the changelog")

// ErrStateAhead is returned (wrapped) when the local store says it applied
// changelog offsets past the partition's end: the changelog topic was
// deleted and recreated under a kept state directory. Delete the task's
// state file (or the whole state dir) to restore from the new changelog.
var ErrStateAhead = errors.New("changelog: local state is ahead of the changelog")

// ErrStateBehind is returned (wrapped) when the local store would resume
// below the partition's log start offset: the records it needs are gone, so
// it must be restored from scratch.
var ErrStateBehind = errors.New("changelog: local state is behind the changelog's start")

const stableAttempts = 20

// DefaultBatchKeys and DefaultBatchBytes bound a restore's batch.
//
// A changelog is in key order only where the job wrote keys in order; the
// updates of a long-running app land all over the key space. bbolt copies
// every page a transaction touches into the heap (its node, then a page
// buffer at commit), so a batch of keys in random order into a tree much
// larger than the batch costs about a page per key: the batch, not the
// state, must bound that. At 10,000 keys four tasks hold at most some
// 4 × 10,000 pages: a restore from scratch into bbolt at 10M keys peaked
// at 1.1 GiB of heap and ran at 354k–543k records/s (two runs) against
// 1.7 GiB and 287k records/s at 50,000 keys (BENCHMARKS.md, "State size
// and restore"); the larger transactions cost more in copying than they
// saved in commits. At 1M keys, where a batch touches every page of a
// task's tree either way, the two are within the runs' noise.
const (
	DefaultBatchKeys  = 10000
	DefaultBatchBytes = 16 << 20
)

// Restore brings a backend up to date from its changelog partition. It reads
// read_committed from p.From and applies every record up to the partition's
// last epoch marker, in log order, in batches of at most BatchKeys records
// and BatchBytes bytes, each sorted by key; the
// entries after the last marker are orphans (see Result.Orphans) and are not
// applied. Applying in log order up to the last marker is exact because
// every orphan key is written again, with its committed value, before the
// next marker (the engine's rule), so a later record always overrides it.
//
// A batch cut between markers is applied with a Partial meta: the store is
// then no task's state until a later batch reaches the marker. A crash in
// between leaves a partial store, which a restore from its ChangelogOffset
// completes.
//
// Restore returns once nothing is still landing: the partition has no open
// transaction (last stable offset = high-water mark), it has been read to
// that end, and the group's committed offsets, fetched with KIP-447's
// require-stable, are not ahead of the last marker. A fenced zombie whose
// commit is still in flight when the partition moves shows up as an open
// transaction or an unstable offset; reading to the end too early would
// replay its epoch twice.
func Restore(ctx context.Context, p RestoreParams) (Result, error) {
	if p.BatchKeys <= 0 {
		p.BatchKeys = DefaultBatchKeys
	}
	if p.BatchBytes <= 0 {
		p.BatchBytes = DefaultBatchBytes
	}
	// A turn (Admit) ends after everything else is given back: the runs
	// on disk, the client.
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	cl := p.Client
	if cl == nil {
		var err error
		if cl, err = kgo.NewClient(p.ClientOpts...); err != nil {
			return Result{}, fmt.Errorf("changelog: restore client: %w", err)
		}
		defer cl.Close()
	}
	r := restorer{
		ctx: ctx,
		p:   p, res: Result{Next: p.From, Last: p.Applied}, pos: p.From, lastMarker: -1,
		tail:   map[string][]byte{},
		reader: newPartitionReader(p.Admin, cl, p.Topic, p.Partition),
	}
	r.takeBuffers()
	defer r.putBuffers()
	if p.RunsDir != "" {
		// A crashed restore's runs are of no use: it applied nothing.
		if err := os.RemoveAll(p.RunsDir); err != nil {
			return Result{}, fmt.Errorf("changelog: restore runs: %w", err)
		}
		if err := os.MkdirAll(p.RunsDir, 0o750); err != nil {
			return Result{}, fmt.Errorf("changelog: restore runs: %w", err)
		}
		defer os.RemoveAll(p.RunsDir)
		r.sorting, r.sortedFrom = true, p.From
	}
	backoff := 50 * time.Millisecond
	for attempt := 0; ; {
		end, start, err := r.stableEnd(ctx)
		if err != nil {
			return r.res, err
		}
		r.res.End = end
		switch {
		case p.From > end:
			return r.res, fmt.Errorf("%w: %s/%d stored offset %d, end %d", ErrStateAhead, p.Topic, p.Partition, p.From, end)
		case p.From > 0 && p.From < start:
			return r.res, fmt.Errorf("%w: %s/%d stored offset %d, log start %d", ErrStateBehind, p.Topic, p.Partition, p.From, start)
		case r.pos < start:
			// A restore from scratch begins where the log does: the
			// records before it were deleted (DeleteRecords, or a
			// broker that moves the start when it compacts).
			r.pos = start
		}
		if p.Admit != nil && release == nil && end-r.pos > int64(p.BatchKeys) {
			if release, err = p.Admit(ctx, end-r.pos); err != nil {
				return r.res, err
			}
			// The wait may have been long: find the end again.
			continue
		}
		if err := r.readTo(ctx, end); err != nil {
			return r.res, err
		}
		ahead, err := r.groupAhead(ctx)
		if err != nil {
			// UNSTABLE_OFFSET_COMMIT outlasting the client's retries
			// means a transaction is still in flight: read again.
			r.logf("fetching the group's stable offsets failed; re-reading", "partition", p.Partition, "err", err)
			ahead = true
		}
		if !ahead {
			if p.Live {
				return r.res, nil
			}
			for k := range r.tail {
				r.res.Orphans = append(r.res.Orphans, []byte(k))
			}
			return r.res, nil
		}
		if attempt >= stableAttempts {
			if err != nil {
				return r.res, err
			}
			return r.res, fmt.Errorf("%w: partition %d, last marker %+v", ErrGroupAhead, p.Partition, r.res.Last)
		}
		r.logf("consumer group offsets ahead of the changelog; re-reading", "partition", p.Partition)
		if err := sleep(ctx, backoff); err != nil {
			return r.res, err
		}
		backoff = min(2*backoff, time.Second)
		attempt++
	}
}

type restorer struct {
	ctx    context.Context // for the merge of the runs (runs.go)
	p      RestoreParams
	res    Result
	reader *partitionReader
	pos    int64 // next changelog offset to read

	// lastMarker is the offset of the last marker below the end read so
	// far (-1: none found yet). Records up to it go to batch, in log
	// order; records after it to tail, until a later round finds a marker
	// past them.
	lastMarker int64
	end        int64      // readTo's end, plus the tail it holds again: pos..end bounds what the batch may still take
	ents       []logEntry // the batch, in log order (see hold)
	slab       slab       // ents' keys and values
	batchBytes int        // key and value bytes in the batch
	batchNext  int64      // offset just past the last record in batch
	marker     *Marker    // the last marker read, applied or not
	tail       map[string][]byte
	muts       []kstate.Mutation // flush's, reused
	applyBuf   []kstate.Mutation // sortedApply's, reused
	// sorting: RunsDir was given and the complete batch is yet to come
	// (runs.go); runs are the files of the batches sorted so far.
	sorting bool
	runs    []string
	// sortedFrom is the changelog offset the backend is complete to while
	// sorting; outOfOrder: a key read was not above the one before it
	// (lastKey), so batches must be sorted, and while sorting they go to
	// runs (see noteOrder).
	sortedFrom int64
	outOfOrder bool
	lastKey    []byte
}

func (r *restorer) logf(msg string, args ...any) {
	if r.p.Logf != nil {
		r.p.Logf(msg, args...)
	}
}

// stableEnd waits until the partition has no open transaction and returns
// its high-water mark (then its last stable offset) and log start offset.
// A live read (RestoreParams.Live) does not wait: it returns the last
// stable offset as it is.
func (r *restorer) stableEnd(ctx context.Context) (end, start int64, err error) {
	backoff := 50 * time.Millisecond
	listEnd, listStable, listStart := r.p.Admin.ListEndOffsets, r.p.Admin.ListCommittedOffsets, r.p.Admin.ListStartOffsets
	if r.p.Live {
		// A standby lists its offsets every round: one partition in a
		// request of its own, rather than the topic's every partition
		// after a metadata request, as kadm does.
		listEnd, listStable, listStart = r.listOne(-1, 0), r.listOne(-1, 1), r.listOne(-2, 0)
	}
	for {
		hwm, err := r.listed(ctx, listEnd)
		if err != nil {
			return 0, 0, err
		}
		lso, err := r.listed(ctx, listStable)
		if err != nil {
			return 0, 0, err
		}
		if lso >= hwm || r.p.Live {
			start, err := r.listed(ctx, listStart)
			if r.p.Live && r.p.From > lso && r.p.From <= hwm {
				// The copy is past the last stable offset, which the
				// commit of the epoch it last applied has yet to move
				// (the task that wrote it just moved here from a
				// member that is now its standby): nothing new yet.
				return r.p.From, start, err
			}
			return lso, start, err
		}
		r.logf("changelog partition has an open transaction; waiting for it to end", "partition", r.p.Partition, "lso", lso, "hwm", hwm)
		if err := sleep(ctx, backoff); err != nil {
			return 0, 0, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// listOne lists the partition's offset at timestamp ts (-1 the end, -2
// the start) with isolation level (0 read_uncommitted, 1 read_committed),
// in listed's form.
func (r *restorer) listOne(ts int64, level int8) func(context.Context, ...string) (kadm.ListedOffsets, error) {
	return func(ctx context.Context, _ ...string) (kadm.ListedOffsets, error) {
		req := kmsg.NewPtrListOffsetsRequest()
		req.ReplicaID = -1
		req.IsolationLevel = level
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = r.p.Topic
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = r.p.Partition, ts, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, r.reader.cl)
		if err != nil {
			return nil, err
		}
		listed := kadm.ListedOffsets{}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if listed[t.Topic] == nil {
					listed[t.Topic] = map[int32]kadm.ListedOffset{}
				}
				listed[t.Topic][p.Partition] = kadm.ListedOffset{Topic: t.Topic, Partition: p.Partition, Offset: p.Offset,
					Timestamp: p.Timestamp, LeaderEpoch: p.LeaderEpoch, Err: kerr.ErrorForCode(p.ErrorCode)}
			}
		}
		return listed, nil
	}
}

func (r *restorer) listed(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
	offs, err := list(ctx, r.p.Topic)
	if err != nil {
		return 0, fmt.Errorf("changelog: list offsets of %s: %w", r.p.Topic, err)
	}
	o, ok := offs.Lookup(r.p.Topic, r.p.Partition)
	if !ok {
		return 0, fmt.Errorf("changelog: %s has no partition %d", r.p.Topic, r.p.Partition)
	}
	if o.Err != nil {
		return 0, fmt.Errorf("changelog: list offsets of %s/%d: %w", r.p.Topic, r.p.Partition, o.Err)
	}
	return o.Offset, nil
}

// readTo reads from pos to end: first it finds the last marker below end
// (reading back from end), then it reads forward, applying everything up to
// that marker and keeping what follows it as the tail.
func (r *restorer) readTo(ctx context.Context, end int64) error {
	if r.pos >= end {
		return nil
	}
	m, err := r.findLastMarker(ctx, r.pos, end)
	if err != nil {
		return err
	}
	// At most this many entries join the batch in this read: the records
	// left to it, and the tail held again below (batchLen).
	r.end = end + int64(len(r.tail))
	if m >= 0 {
		// The tail read so far lies before this marker: it is part of
		// the state after all, after the batch. Its keys are unique; in
		// key order they are in the order they were read unless
		// noteOrder saw a key out of order.
		for _, k := range slices.Sorted(maps.Keys(r.tail)) {
			r.hold([]byte(k), r.tail[k])
		}
		clear(r.tail)
		r.lastMarker = m
	}
	return r.scan(ctx, &r.pos, end, r.add)
}

// findLastMarker returns the offset of the last marker in [from, end), or
// -1. It reads windows back from end, growing each time; after compaction
// the last marker is near the end whatever the partition's size, so the
// first window nearly always holds it.
func (r *restorer) findLastMarker(ctx context.Context, from, end int64) (int64, error) {
	window := int64(4096)
	hi := end
	for hi > from {
		lo := max(from, hi-window)
		found := int64(-1)
		pos := lo
		err := r.scan(ctx, &pos, hi, func(rec *kgo.Record) error {
			if !rec.Attrs.IsControl() && IsMarker(rec.Key) {
				found = rec.Offset
			}
			return nil
		})
		if err != nil || found >= 0 {
			return found, err
		}
		hi = lo
		window *= 8
	}
	return -1, nil
}

// scan hands fn every record of [*pos, end), advancing *pos. Control
// records (commit and abort markers) are included so the position is seen
// to pass them. The records' keys and values point into the fetch
// response: what fn keeps it copies, so a batch held for applying does not
// pin whole responses.
func (r *restorer) scan(ctx context.Context, pos *int64, end int64, fn func(*kgo.Record) error) error {
	backoff := 50 * time.Millisecond
	for *pos < end {
		f, err := r.reader.fetch(ctx, *pos)
		if err != nil {
			return err
		}
		recs, next := f.recs, f.next
		for _, rec := range recs {
			if rec.Offset >= end {
				*pos = end
				break
			}
			if err := fn(rec); err != nil {
				return err
			}
			*pos = rec.Offset + 1
		}
		switch {
		case next > *pos:
			// Past batches that held nothing for us: aborted,
			// emptied by compaction, or records already read.
			*pos = min(next, end)
		case len(recs) == 0 && f.lso >= end:
			// No batch at or after the position below a last stable
			// offset that reaches the end: compaction removed the rest.
			*pos = end
		case len(recs) == 0:
			// The answering broker has not caught up to the end (a
			// new leader, a lagging replica): ask the leader again.
			r.reader.forget()
			if err := sleep(ctx, backoff); err != nil {
				return err
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if r.p.Progress != nil {
			r.p.Progress(r.res.Records, max(0, end-*pos))
		}
	}
	return nil
}

// add takes one record of the forward read.
func (r *restorer) add(rec *kgo.Record) error {
	if rec.Attrs.IsControl() {
		return nil
	}
	r.res.Records++
	if rec.Offset > r.lastMarker {
		if IsMarker(rec.Key) {
			// findLastMarker read the same committed range.
			return fmt.Errorf("changelog: %s/%d offset %d: a marker after the last one (%d)", rec.Topic, rec.Partition, rec.Offset, r.lastMarker)
		}
		if _, err := kstate.DecodeKey(rec.Key); err != nil {
			return fmt.Errorf("changelog: %s/%d offset %d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		}
		r.noteOrder(rec.Key)
		r.tail[string(rec.Key)] = bytes.Clone(rec.Value)
		return nil
	}
	r.batchNext = rec.Offset + 1
	if IsMarker(rec.Key) {
		m, err := DecodeMarker(rec.Value)
		if err != nil {
			return fmt.Errorf("changelog: %s/%d offset %d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		}
		r.marker = &m
		if rec.Offset == r.lastMarker {
			return r.flush(false)
		}
		return nil
	}
	if _, err := kstate.DecodeKey(rec.Key); err != nil {
		return fmt.Errorf("changelog: %s/%d offset %d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	r.noteOrder(rec.Key)
	r.hold(rec.Key, rec.Value)
	if r.full() {
		return r.flush(true)
	}
	return nil
}

// full reports whether the batch reached its bounds and must be flushed.
func (r *restorer) full() bool {
	if r.sorting && r.outOfOrder {
		// A batch for a run is bounded by bytes alone, with what an
		// entry costs beside its bytes: a run has no pages to bound.
		return r.batchBytes+runEntryOverhead*len(r.ents) >= r.p.BatchBytes
	}
	return len(r.ents) >= r.p.BatchKeys || r.batchBytes >= r.p.BatchBytes
}

// hold adds an entry to the batch, copying its key and value into the slab
// (runs.go); a nil value, a tombstone, stays nil. A key written twice is in
// the batch twice: sortedBatch keeps the later.
func (r *restorer) hold(key, value []byte) {
	e := logEntry{Mutation: kstate.Mutation{Key: r.slab.copy(key)}, seq: len(r.ents)}
	if value != nil {
		e.Value = r.slab.copy(value)
	}
	if n := len(r.ents); n == cap(r.ents) && n >= growAfter {
		r.ents = slices.Grow(r.ents, r.batchLen()-n)
	}
	r.ents = append(r.ents, e)
	r.batchBytes += len(key) + len(value)
}

// flush applies the batch: complete when it ends at the last marker,
// partial otherwise. While sorting (runs.go), a partial batch becomes a run
// and the complete one is merged with the runs.
func (r *restorer) flush(partial bool) error {
	meta := kstate.Meta{ChangelogOffset: r.batchNext, Partial: partial, AppliedAt: time.Now()}
	if last := r.marker; last != nil {
		meta.Epoch, meta.Offsets, meta.Watermark, meta.SinkTxn = last.Epoch, last.Offsets, last.Watermark, last.SinkTxn
	} else if r.res.Last != nil {
		meta.Epoch, meta.Offsets, meta.Watermark, meta.SinkTxn = r.res.Last.Epoch, r.res.Last.Offsets, r.res.Last.Watermark, r.res.Last.SinkTxn
	}
	var err error
	switch {
	case r.sorting && !r.outOfOrder:
		// The changelog is in key order so far: apply it as it comes.
		err = r.applySorted(r.sortedBatch(), meta)
	case r.sorting && partial:
		err = r.spill(meta)
	case r.sorting:
		err = r.mergeRuns(meta)
	default:
		// The backend's stable sort, which it skips for sorted input,
		// does not run: with 50,000 keys in random order it cost more
		// CPU than any other step of the apply.
		if err = r.p.Apply(r.sortedBatch(), meta); err != nil {
			err = fmt.Errorf("changelog: apply restored batch: %w", err)
		}
	}
	if err != nil {
		return err
	}
	r.clearBatch()
	if !partial {
		r.sorting = false // the backend holds a complete epoch now
		r.res.Last, r.res.Next = r.marker, r.batchNext
	}
	return nil
}

// groupAhead reports whether the group's stable committed offsets for the
// task's input partitions are past the last marker read. RequireStable makes
// the broker answer only once no transactional offset commit is pending.
func (r *restorer) groupAhead(ctx context.Context) (bool, error) {
	if r.p.Group == "" || r.p.Live {
		return false, nil
	}
	last := r.res.Last
	offs, err := r.p.Admin.FetchOffsetsForTopics(kadm.RequireStable(ctx), r.p.Group, r.p.InputTopics...)
	if err != nil {
		return false, fmt.Errorf("changelog: fetch stable offsets of group %s: %w", r.p.Group, err)
	}
	for _, t := range r.p.InputTopics {
		o, ok := offs.Lookup(t, r.p.Partition)
		if !ok || o.Err != nil || o.At < 0 {
			continue
		}
		var mine int64 = -1
		if last != nil {
			if v, ok := last.Offsets[t]; ok {
				mine = v
			}
		}
		if o.At > mine && (last != nil || o.At > 0) {
			r.logf("group committed offset ahead of changelog marker", "topic", t, "partition", r.p.Partition, "group", o.At, "marker", mine, "from", r.p.From, "position", r.pos, "records", r.res.Records)
			return true, nil
		}
	}
	return false, nil
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
