package sluice

import (
	"context"
	"fmt"
	"maps"
	"math"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink"
)

// task is one input partition number with its store. Only the loop
// goroutine touches a running task, or while the loop waits for them, one
// worker processing the task's records (parallel.go), or one applying the
// committed epoch to the task's backend (task.write, loop.applyTasks).
type task struct {
	p     int32
	label string
	store *kstate.Store

	// epoch is the last epoch applied to the backend; committed the input
	// offsets it reflects (the rewind point); next the offsets after the
	// records processed in the open epoch.
	epoch     uint64
	committed map[string]int64
	next      map[string]int64
	advanced  bool // records were consumed in the open epoch

	// spare holds free record slots for the task's outputs and changelog
	// records (see record); recSlab is the unused part of the slab of
	// Records handed to Process.
	spare   []*outSlot
	recSlab []Record
	// pclock is its records' processing time (proctime.go).
	pclock procClock

	marker *kgo.Record       // this epoch's marker, once produced
	dirty  []kstate.Mutation // the epoch's changes as they went to the changelog
	rc     recordContext
	// sealed is the epoch whose transaction commits while the task
	// processes the next one (pipelined epochs, see pipelined.go), nil
	// when none does.
	sealed *sealedEpoch

	// co is what the task knows of each input topic, when it reads
	// several (copartition.go); nil otherwise.
	co map[string]*coInput
	// sink holds the epoch's rows for Options.Sink (nil until the first);
	// sinkID names their transaction once the marker did (see sink.go).
	sink   txsink.EpochTxn
	sinkID *txsink.TxnID

	clock  *eventClock // event time; nil unless the job declares EventTime
	timers taskTimers
	// sweepCursor is where the next TTL sweep resumes (nil: the start);
	// sweptAt when the last one ran.
	sweepCursor []byte
	sweptAt     time.Time

	// poison holds inputs whose outputs failed permanently (see
	// poison.go). The map belongs to the instance, so what a session
	// learned survives the session.
	poison map[inputRef]*poison
	// replayUntil, after a commit refused because of a poison input, is
	// where the refused attempt ended: the replay ends there too, so each
	// replay makes progress instead of taking in new records (and maybe
	// new poison) every time.
	replayUntil map[string]int64
	// orphans are changelog keys written without a marker that commits
	// them: by a failed at-least-once attempt, or found after the last
	// marker by the restore. The next epoch writes each again with its
	// committed value (see preCommit).
	orphans map[string]struct{}

	// The task's series, looked up once: a label lookup per record costs
	// more than the rest of the bookkeeping.
	recordsIn, recordsOut, processingErrors, dlq, timersFired prometheus.Counter
	// inCount and outCount are records in and out not yet added to
	// recordsIn and recordsOut: a counter's Add per record was about
	// 1.5 % of echo's CPU, so the loop adds them once an iteration
	// (flushCounts).
	inCount, outCount int
}

func newTask(in *Instance, p int32, be kstate.Backend, meta kstate.Meta) (*task, error) {
	label := strconv.Itoa(int(p))
	m := in.m
	t := &task{
		p:                p,
		label:            label,
		store:            kstate.NewStore(be),
		poison:           in.poisonOf(p),
		epoch:            meta.Epoch,
		committed:        maps.Clone(meta.Offsets),
		recordsIn:        m.recordsIn.WithLabelValues(label),
		recordsOut:       m.recordsOut.WithLabelValues(label),
		processingErrors: m.processingErrors.WithLabelValues(label),
		dlq:              m.dlq.WithLabelValues(label),
		timersFired:      m.timersFired.WithLabelValues(label),
	}
	if t.committed == nil {
		t.committed = map[string]int64{}
	}
	t.store.SetMaxEntryBytes(in.maxEntryBytes())
	t.next = maps.Clone(t.committed)
	t.rc.t = t
	if in.cfg.Job.EventTime {
		t.clock = newEventClock(in.cfg.InputTopics, in.cfg.MaxOutOfOrderness, in.cfg.IdleTimeout, meta.Watermark, in.clock.Now())
	}
	if err := t.loadTimers(); err != nil {
		return nil, err
	}
	t.publishTime(in)
	return t, nil
}

// publishTime sets the task's timer and watermark gauges.
func (t *task) publishTime(in *Instance) {
	st := t.store.Backend().Stats()
	for _, d := range timerDomains {
		in.m.timers.WithLabelValues(t.label, domainLabel(d)).Set(float64(st.Timers(d)))
	}
	if t.clock != nil && t.clock.wm != noTime {
		in.m.watermarkLag.WithLabelValues(t.label).Set(in.clock.Now().Sub(t.clock.watermark()).Seconds())
	}
}

// watermark is the task's watermark for the marker and meta: zero without
// event time.
func (t *task) watermark() time.Time {
	if t.clock == nil {
		return time.Time{}
	}
	return t.clock.watermark()
}

// offsets are consumer positions per topic and partition, in the shape
// franz-go takes them.
type offsets map[string]map[int32]kgo.EpochOffset

// set places partition p of topic at off (no leader epoch: the offset comes
// from a marker, not from a fetched record).
func (o offsets) set(topic string, p int32, off int64) {
	if o[topic] == nil {
		o[topic] = map[int32]kgo.EpochOffset{}
	}
	o[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: off}
}

// setAll places the task's partition of every topic in at.
func (o offsets) setAll(p int32, at map[string]int64) {
	for topic, off := range at {
		o.set(topic, p, off)
	}
}

// discard drops the open epoch: nothing of it reached the backend. With
// orphaned set, the changelog entries the epoch produced stay in the topic
// without a marker (at-least-once has no transaction to abort them), so
// their keys are rewritten by the next epoch.
func (t *task) discard(orphaned bool) {
	if orphaned {
		for _, m := range t.dirty {
			t.orphan(m.Key)
		}
	}
	t.store.Discard()
	t.next = maps.Clone(t.committed)
	t.advanced = false
	t.marker, t.dirty, t.sealed = nil, nil, nil
	t.sink, t.sinkID = nil, nil
	if t.clock != nil {
		t.clock.rewind()
	}
	// Timers fired in the epoch are registered again: look again.
	for _, d := range timerDomains {
		if err := t.refreshNext(d); err != nil {
			t.timers.next[d] = math.MinInt64 // the next firing reads again, and reports the error
		}
	}
}

// orphan records a changelog key whose last record no marker commits.
func (t *task) orphan(key []byte) {
	if t.orphans == nil {
		t.orphans = map[string]struct{}{}
	}
	t.orphans[string(key)] = struct{}{}
}

// preCommit produces the epoch's changelog entries for the task: one record
// per dirty key (nil value = tombstone). The marker follows in
// produceMarker, at once under exactly-once (one transaction holds both)
// and only after the entries and outputs were acknowledged at-least-once.
//
// Orphaned keys are written again first, with their committed value
// (unless the epoch changed them): the last record of such a key in the
// changelog must be a committed one, or compaction would keep the orphan
// and a restore from scratch would fold it into the next marker.
//
// Ordering rule: the marker is produced after every entry of the epoch, to
// the same partition, so a reader that has seen the marker has seen the
// whole epoch.
func (t *task) preCommit(in *Instance, produce func(*kgo.Record)) (records int, err error) {
	t.marker, t.dirty = nil, nil
	for k := range t.orphans {
		if err := t.store.Rewrite([]byte(k)); err != nil {
			return 0, fmt.Errorf("task %d: rewrite orphaned key: %w", t.p, err)
		}
	}
	if !t.advanced && t.store.DirtyLen() == 0 {
		return 0, nil
	}
	t.dirty = t.store.Dirty()
	hdr := t.epochHeader()
	var bytes int
	now := time.Now() // one stamp for the epoch's records, not one each
	for _, m := range t.dirty {
		r := t.record(true)
		r.Topic, r.Partition, r.Key, r.Value, r.Headers, r.Timestamp = in.changelogTopic, t.p, m.Key, m.Value, hdr, now
		produce(r)
		bytes += len(m.Key) + len(m.Value)
		records++
	}
	in.m.changelogRecords.Add(float64(records))
	in.m.changelogBytes.Add(float64(bytes))
	return records, nil
}

// pending reports whether preCommit produced anything, so the task needs a
// marker.
func (t *task) pending() bool { return t.dirty != nil || t.advanced }

// produceMarker produces the epoch's marker with the next input offsets.
func (t *task) produceMarker(in *Instance, produce func(*kgo.Record)) {
	value := changelog.EncodeMarker(changelog.Marker{Epoch: t.epoch + 1, Offsets: t.next, Watermark: t.watermark(), Job: in.cfg.Job.Name, SinkTxn: t.sinkTxn(in)})
	t.marker = &kgo.Record{Topic: in.changelogTopic, Partition: t.p, Context: explicitCtx, Key: changelog.MarkerKey, Value: value, Headers: t.epochHeader()}
	produce(t.marker)
	in.m.changelogRecords.Inc()
	in.m.changelogBytes.Add(float64(len(changelog.MarkerKey) + len(value)))
}

func (t *task) epochHeader() []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: changelog.EpochHeader, Value: changelog.EncodeEpoch(t.epoch + 1)}}
}

// An epoch is applied to a task in four steps, so that the backend's
// transaction runs on a goroutine of its own, beside other tasks' and
// behind the next epoch's processing (loop.applyTasks), while the rest
// stays on the loop goroutine: epochMeta, write (which starts the
// backend's transaction), applied (the task moves to the epoch at once:
// its store reads the epoch from its write-set until the backend has it),
// settled (the backend has it). Ordering rule: only after the Kafka
// transaction (or, at-least-once, the offset commit) succeeded, and only
// for a task that wrote a marker.

// epochMeta is the meta the task's backend takes with the committed epoch.
func (t *task) epochMeta(in *Instance) kstate.Meta {
	e := t.ending()
	meta := kstate.Meta{Epoch: t.epoch + 1, ChangelogOffset: e.marker.Offset + 1, Offsets: maps.Clone(e.next), AppliedAt: in.now(), Watermark: e.watermark}
	if e.sinkID != nil {
		meta.SinkTxn = e.sinkID.String()
	}
	return meta
}

// write starts advancing the backend to the committed epoch, in one
// backend transaction with its meta, which start runs (see
// kstate.Store.ApplyBehind). It touches only the task's store. Its error
// is a write behind of an earlier epoch that failed.
func (t *task) write(meta kstate.Meta, start func(write func())) error {
	if err := t.store.ApplyBehind(t.ending().dirty, meta, start); err != nil {
		return fmt.Errorf("task %d: apply epoch %d: %w", t.p, meta.Epoch, err)
	}
	return nil
}

// applied moves the task to the committed epoch, whose backend write
// write started.
func (t *task) applied(in *Instance, meta kstate.Meta) {
	t.epoch = meta.Epoch
	// Copies: the write still reads meta.Offsets, and the loop adds to
	// committed the first offset of a topic new to the task (take).
	before := t.committed
	t.committed = maps.Clone(meta.Offsets)
	if t.sealed != nil {
		// The epoch after it goes on from where it ended: its records,
		// marker, clock and timers are its own. A topic it was the first
		// to read keeps the rewind point take gave it.
		for topic, off := range before {
			if _, ok := t.committed[topic]; !ok {
				t.committed[topic] = off
			}
		}
		t.sealed = nil
		t.orphans, t.replayUntil = nil, nil
		if t.clock != nil {
			t.clock.commitSealed()
		}
		return
	}
	t.next = maps.Clone(meta.Offsets)
	t.advanced = false
	t.marker, t.dirty, t.orphans, t.replayUntil = nil, nil, nil, nil
	t.sink, t.sinkID = nil, nil
	if t.clock != nil {
		t.clock.commit()
	}
}

// settled follows the end of the backend's write: what reads the backend
// itself (poison of timers, gauges) reads it now.
func (t *task) settled(in *Instance) {
	in.m.epoch.WithLabelValues(t.label).Set(float64(t.epoch))
	t.prunePoison()
	t.publishTime(in)
	st := t.store.Backend().Stats()
	in.m.stateKeys.WithLabelValues(t.label).Set(float64(st.Keys))
	in.m.stateBytes.WithLabelValues(t.label).Set(float64(st.Bytes))
	in.m.stateHeapBytes.WithLabelValues(t.label).Set(float64(st.HeapBytes))
}

// recordContext is the Context of the record being processed; one per
// task, reused for every record.
type recordContext struct {
	ctx context.Context
	t   *task
	in  *Instance
	key []byte
	now time.Time // processing time
	// wall is now when the processing-time clock is the wall clock, the
	// zero time otherwise: the timestamp of outputs whose event time
	// Kafka cannot carry (stamp; zero lets franz-go stamp them), read
	// without a second reading of the clock per record.
	wall time.Time
	ts   time.Time // the record's or timer's event time
	out  []*kgo.Record
	// rows are the record's rows for the sink (WriteRow); they join the
	// task's epoch only if the record succeeds.
	rows [][]any
	// broadcasting: the context is Job.OnBroadcast's (broadcast.go).
	broadcasting bool
}

// Broadcasting reports whether the broadcast stream is being handled: only
// then may broadcast state be written (kstate.Broadcast).
func (c *recordContext) Broadcasting() bool { return c.broadcasting }

func (c *recordContext) Store() *kstate.Store        { return c.t.store }
func (c *recordContext) Key() []byte                 { return c.key }
func (c *recordContext) Now() time.Time              { return c.now }
func (c *recordContext) Context() context.Context    { return c.ctx }
func (c *recordContext) Task() int32                 { return c.t.p }
func (c *recordContext) OutputTopic() string         { return c.in.cfg.OutputTopic }
func (c *recordContext) Timestamp() time.Time        { return c.ts }
func (c *recordContext) CurrentWatermark() time.Time { return c.t.watermark() }

func (c *recordContext) Emit(key, value []byte, headers ...Header) {
	c.emit(c.in.cfg.OutputTopic, false, 0, key, value, headers, c.ts)
}

func (c *recordContext) EmitTo(topic string, key, value []byte, headers ...Header) {
	c.emit(topic, false, 0, key, value, headers, c.ts)
}

func (c *recordContext) EmitToPartition(topic string, partition int32, key, value []byte, headers ...Header) {
	c.emit(topic, true, partition, key, value, headers, c.ts)
}

func (c *recordContext) Output(tag OutputTag, key, value []byte, headers ...Header) {
	c.output(tag, key, value, headers, c.ts)
}

// emit adds an output at event time ts to the record's outputs: to the
// given partition if explicit, else to the key's.
func (c *recordContext) emit(topic string, explicit bool, partition int32, key, value []byte, headers []Header, ts time.Time) {
	r := c.t.record(explicit)
	r.Topic, r.Key, r.Value, r.Headers, r.Timestamp = topic, key, value, kgoHeaders(headers), c.stamp(ts)
	if explicit {
		r.Partition = partition
	}
	c.out = append(c.out, r)
}

// output emits to the topic the side output tag is bound to.
func (c *recordContext) output(tag OutputTag, key, value []byte, headers []Header, ts time.Time) {
	topic, ok := c.in.cfg.SideOutputTopics[tag]
	if !ok {
		// Undeclared and unbound: the record fails (dead letter) rather
		// than its output vanishing.
		c.t.store.Fail(fmt.Errorf("side output %q is not bound to a topic", tag))
		return
	}
	c.emit(topic, false, 0, key, value, headers, ts)
}

// stamp is the Kafka timestamp of an output at event time ts: ts itself,
// as Kafka Streams and Flink stamp theirs, so that a later job in event
// time sees the time of what the output came from. A time Kafka cannot
// carry (before 1970, or the zero time) or franz-go cannot encode (after
// 2262: it goes through UnixNano) gives way to the processing time: c.wall,
// or zero, which franz-go stamps when it produces the record.
func (c *recordContext) stamp(ts time.Time) time.Time {
	if ms := ts.UnixMilli(); ms < 0 || ms > maxStampMs {
		return c.wall
	}
	return ts
}

// maxStampMs is the last millisecond franz-go encodes (as UnixNano / 1e6).
const maxStampMs = math.MaxInt64 / int64(time.Millisecond)

// record returns a fresh record, its Context an outCtx (explicit says its
// Partition is set by the caller): one franz-go is done with (recycle), or
// else one of a new slab. A slab holds many records and is dropped whole
// by the garbage collector once none of them is in use, so outputs and
// changelog records cost no allocation each, and recycled ones no garbage
// either.
func (t *task) record(explicit bool) *kgo.Record {
	if len(t.spare) == 0 {
		t.spare = outSlots.take(t.spare, slabLen)
		if len(t.spare) == 0 {
			t.spare = newSlots(t.spare)
		}
	}
	n := len(t.spare) - 1
	s := t.spare[n]
	t.spare[n] = nil
	t.spare = t.spare[:n]
	// The input reference and dlq are left as the slot's last use had
	// them: only outPromised reads them, of records produceFor sent,
	// which sets them first. Clearing them here as well cost aggregate
	// some 3 % of its CPU samples, in produceFor's store that follows
	// (BENCHMARKS.md); a stale one holds at most a topic name or a
	// timer's key.
	s.ctx.explicit, s.ctx.task = explicit, t.p
	return &s.rec
}

// newSlots appends the slots of a new slab to dst. Each record's Context
// is set once for the slot's life: franz-go may still read a record's
// Context, and the Context's Done, on a goroutine of its own after the
// promise (waitUnknownTopic, for the first record to a topic it has no
// metadata for yet).
func newSlots(dst []*outSlot) []*outSlot {
	slab := make([]outSlot, slabLen)
	for i := range slab {
		s := &slab[i]
		s.ctx.Context = context.Background()
		s.rec.Context = &s.ctx
		s.ctx.slot = s
		dst = append(dst, s)
	}
	return dst
}

// outSlots are records whose produce finished, for task.record to reuse.
var outSlots slotList

// slotList is a list of free record slots. Promises put slots back on
// franz-go's goroutines and tasks take them on the loop's (or a worker's),
// so a sync.Pool found its own P's share empty at almost every Get and
// stole from another P's: three quarters of task.record's time in
// aggregate's profile. Here a put costs a lock, and a task takes a slab's
// worth at once into a spare stack of its own (a new slab's when the list
// is empty), so neither side allocates once warm and a task holds no more
// spare slots than it did of its own slab before.
//
// Like a sync.Pool, the list lets go of what is not used: at each garbage
// collection (trim) it drops the slots that were in it at the one before
// and have not been taken since, so a burst's slots, and the slabs they
// keep alive, go back to the collector once the burst is over.
type slotList struct {
	mu   sync.Mutex
	free []*outSlot // a stack: the oldest at the bottom
	low  int        // the fewest free slots since the last trim
}

// maxFreeSlots bounds the slots kept for reuse (7.5 MiB of them); beyond
// it a slot is left to the collector. A steady flow needs about what is in
// flight between a record's produce and its acknowledgement.
const maxFreeSlots = 1 << 15

func (l *slotList) put(s *outSlot) {
	l.mu.Lock()
	if len(l.free) < maxFreeSlots {
		l.free = append(l.free, s)
	}
	l.mu.Unlock()
}

// putAll puts every slot of ss, as put does each.
func (l *slotList) putAll(ss []*outSlot) {
	l.mu.Lock()
	l.free = append(l.free, ss[:min(len(ss), max(0, maxFreeSlots-len(l.free)))]...)
	l.mu.Unlock()
}

// take moves up to n free slots onto dst, the most recently freed first
// (their memory is the likeliest to be in cache).
func (l *slotList) take(dst []*outSlot, n int) []*outSlot {
	l.mu.Lock()
	k := max(0, len(l.free)-n)
	dst = append(dst, l.free[k:]...)
	clear(l.free[k:])
	l.free = l.free[:k]
	l.low = min(l.low, k)
	l.mu.Unlock()
	return dst
}

// trim drops the slots at the bottom of the stack that no take reached
// since the last trim.
func (l *slotList) trim() {
	l.mu.Lock()
	if n := l.low; n > 0 {
		m := copy(l.free, l.free[n:])
		clear(l.free[m:])
		l.free = l.free[:m]
	}
	l.low = len(l.free)
	l.mu.Unlock()
}

// gcTick is an object whose only use is to be collected: trimAtGC's
// cleanup runs after the collection that freed it. It holds a pointer so
// that it is not a tiny allocation, which may share its memory (and its
// life) with other objects.
type gcTick struct{ _ *int }

// trimAtGC trims outSlots after the next garbage collection, and again
// after every one after it.
func trimAtGC() {
	runtime.AddCleanup(new(gcTick), func(struct{}) {
		outSlots.trim()
		trimAtGC()
	}, struct{}{})
}

func init() { trimAtGC() }

// undo drops what the record or timer being handled did, when it failed:
// its state writes, and its outputs, which were never produced (recycled,
// so that they do not keep their slab alive: see recycle).
func (t *task) undo() {
	t.store.RollbackRecord()
	for _, r := range t.rc.out {
		recycle(r)
	}
}

// recycle hands r, if task.record made it, back for reuse: from a promise
// franz-go called (it is done with the record's fields then: its promise
// may even modify them; not always with its Context, see task.record,
// found by the race detector) other than the session's two, which use
// loop.recycled (that is, produceAlone's), or for an output that was never
// produced (its record failed: task.undo; held records dropped). Nothing
// else may keep the record. A record left out is not lost, but it keeps
// its slab, and so its slab siblings' keys and values, alive as long as
// any of them circulates.
func recycle(r *kgo.Record) {
	if s := emptied(r); s != nil {
		outSlots.put(s)
	}
}

// emptied clears r, if task.record made it, and returns its slot for the
// free list; nil for any other record.
func emptied(r *kgo.Record) *outSlot {
	c, ok := r.Context.(*outCtx)
	if !ok || c.slot == nil || r != &c.slot.rec {
		return nil // not task.record's, or a copy of one (which must not put its slot twice)
	}
	// Let go of the key, value and headers, field by field: the Context
	// is never written again (see task.record).
	r.Key, r.Value, r.Headers, r.Topic, r.Timestamp = nil, nil, nil, "", time.Time{}
	r.Partition, r.Attrs, r.ProducerEpoch, r.ProducerID, r.LeaderEpoch, r.Offset = 0, kgo.RecordAttrs{}, 0, 0, 0, 0
	return c.slot
}

// recycled is recycle for the promises of the session's client: the slot
// waits in l.freed, and a slab's worth goes to the free list under one
// lock (a lock a record was 3-6 % of aggregate's CPU samples). Only those
// promises touch l.freed, and franz-go calls a client's promises one at a
// time. Slots still waiting when the session ends are left to the
// collector.
func (l *loop) recycled(r *kgo.Record) {
	s := emptied(r)
	if s == nil {
		return
	}
	l.freed = append(l.freed, s)
	if len(l.freed) == slabLen {
		list := l.slots
		if list == nil {
			list = &outSlots
		}
		list.putAll(l.freed)
		clear(l.freed)
		l.freed = l.freed[:0]
	}
}

func kgoHeaders(hs []Header) []kgo.RecordHeader {
	if len(hs) == 0 {
		return nil
	}
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}

func apiRecord(r *kgo.Record) *Record {
	rec := &Record{}
	fillRecord(rec, r)
	return rec
}

// fillRecord sets rec to r's fields. The headers are copied into a slice
// of rec's own, the key and value shared.
func fillRecord(rec *Record, r *kgo.Record) {
	var hs []Header
	if len(r.Headers) > 0 {
		hs = make([]Header, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = Header{Key: h.Key, Value: h.Value}
		}
	}
	*rec = Record{Key: r.Key, Value: r.Value, Headers: hs, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp}
}

// inputRecord is apiRecord from the task's slab of Records: a job may keep
// the Record it is given, so each is a Record of its own, but they are
// allocated many at a time.
func (t *task) inputRecord(r *kgo.Record) *Record {
	rec := fromSlab(&t.recSlab)
	fillRecord(rec, r)
	return rec
}

// fromSlab takes the next element of *slab, the unused part of a slab,
// allocating a new slab of slabLen when it is used up.
func fromSlab[T any](slab *[]T) *T {
	if len(*slab) == 0 {
		*slab = make([]T, slabLen)
	}
	e := &(*slab)[0]
	*slab = (*slab)[1:]
	return e
}

// Dead-letter headers say where a record came from and why it failed.
const (
	HeaderError     = "sluice.error"
	HeaderStage     = "sluice.stage"
	HeaderJob       = "sluice.job"
	HeaderTopic     = "sluice.source.topic"
	HeaderPartition = "sluice.source.partition"
	HeaderOffset    = "sluice.source.offset"
	// HeaderTruncated is set on a dead letter whose key and value were
	// left out because the dead-letter topic refused the whole record.
	HeaderTruncated = "sluice.truncated"
)

func (in *Instance) deadLetter(r *kgo.Record, err error, stage string) *kgo.Record {
	hs := append([]kgo.RecordHeader{}, r.Headers...)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderError, Value: []byte(err.Error())},
		kgo.RecordHeader{Key: HeaderStage, Value: []byte(stage)},
		kgo.RecordHeader{Key: HeaderJob, Value: []byte(in.cfg.Job.Name)},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
	)
	return &kgo.Record{Topic: in.cfg.DLQTopic, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp}
}

// flushCounts adds the records in and out since the last flush to the
// task's counters.
func (t *task) flushCounts() {
	if t.inCount > 0 {
		t.recordsIn.Add(float64(t.inCount))
		t.inCount = 0
	}
	if t.outCount > 0 {
		t.recordsOut.Add(float64(t.outCount))
		t.outCount = 0
	}
}

// flushCounts adds every task's records in and out to its counters, and
// those processed while the epoch before committed to the overlap's.
func (l *loop) flushCounts() {
	n := 0
	for _, t := range l.tasks {
		n += t.inCount
		t.flushCounts()
	}
	if l.holding && n > 0 {
		l.in.m.overlapped.Add(float64(n))
	}
}
