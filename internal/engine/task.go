package engine

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/api"
	"github.com/sluicehq/sluice/kstate"
)

// task is one input partition number with its store. Only the loop
// goroutine touches a running task.
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

	marker *kgo.Record       // this epoch's marker, once pre-committed
	dirty  []kstate.Mutation // the epoch's changes as they went to the changelog
	rc     recordContext

	// The task's series, looked up once: a label lookup per record costs
	// more than the rest of the bookkeeping.
	recordsIn, recordsOut, processingErrors, dlq prometheus.Counter
}

func newTask(p int32, be kstate.Backend, meta kstate.Meta, m *metrics) *task {
	label := strconv.Itoa(int(p))
	t := &task{
		p:                p,
		label:            label,
		store:            kstate.NewStore(be),
		epoch:            meta.Epoch,
		committed:        maps.Clone(meta.Offsets),
		recordsIn:        m.recordsIn.WithLabelValues(label),
		recordsOut:       m.recordsOut.WithLabelValues(label),
		processingErrors: m.processingErrors.WithLabelValues(label),
		dlq:              m.dlq.WithLabelValues(label),
	}
	if t.committed == nil {
		t.committed = map[string]int64{}
	}
	t.next = maps.Clone(t.committed)
	t.rc.t = t
	return t
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

// discard drops the open epoch: nothing of it reached the backend.
func (t *task) discard() {
	t.store.Discard()
	t.next = maps.Clone(t.committed)
	t.advanced = false
	t.marker, t.dirty = nil, nil
}

// preCommit produces the epoch's changelog for the task: one record per
// dirty key (nil value = tombstone), then the marker with the next input
// offsets. Ordering rule: the marker is produced after every entry of the
// epoch, to the same partition, so a reader that has seen the marker has
// seen the whole epoch.
func (t *task) preCommit(in *Instance, produce func(*kgo.Record)) (records int) {
	t.marker, t.dirty = nil, nil
	if !t.advanced && t.store.DirtyLen() == 0 {
		return 0
	}
	t.dirty = t.store.Dirty()
	epoch := t.epoch + 1
	hdr := []kgo.RecordHeader{{Key: changelog.EpochHeader, Value: changelog.EncodeEpoch(epoch)}}
	var bytes int
	for _, m := range t.dirty {
		produce(&kgo.Record{Topic: in.changelogTopic, Partition: t.p, Context: explicitCtx, Key: m.Key, Value: m.Value, Headers: hdr})
		bytes += len(m.Key) + len(m.Value)
		records++
	}
	value := changelog.EncodeMarker(changelog.Marker{Epoch: epoch, Offsets: t.next})
	t.marker = &kgo.Record{Topic: in.changelogTopic, Partition: t.p, Context: explicitCtx, Key: changelog.MarkerKey, Value: value, Headers: hdr}
	produce(t.marker)
	records++
	in.m.changelogRecords.Add(float64(records))
	in.m.changelogBytes.Add(float64(bytes + len(changelog.MarkerKey) + len(value)))
	return records
}

// apply advances the backend to the committed epoch, in one backend
// transaction with its meta. Ordering rule: called only after the Kafka
// transaction (or, at-least-once, the offset commit) succeeded.
func (t *task) apply(in *Instance) error {
	if t.marker == nil {
		return nil
	}
	meta := kstate.Meta{Epoch: t.epoch + 1, ChangelogOffset: t.marker.Offset + 1, Offsets: maps.Clone(t.next)}
	if err := t.store.Apply(t.dirty, meta); err != nil {
		return fmt.Errorf("task %d: apply epoch %d: %w", t.p, meta.Epoch, err)
	}
	t.epoch = meta.Epoch
	t.committed = meta.Offsets
	t.next = maps.Clone(meta.Offsets)
	t.advanced = false
	t.marker, t.dirty = nil, nil
	in.m.epoch.WithLabelValues(t.label).Set(float64(t.epoch))
	st := t.store.Backend().Stats()
	in.m.stateKeys.WithLabelValues(t.label).Set(float64(st.Keys))
	in.m.stateBytes.WithLabelValues(t.label).Set(float64(st.Bytes))
	return nil
}

// recordContext is the api.Context of the record being processed; one per
// task, reused for every record.
type recordContext struct {
	ctx context.Context
	t   *task
	in  *Instance
	key []byte
	now time.Time
	out []*kgo.Record
}

func (c *recordContext) Store() *kstate.Store     { return c.t.store }
func (c *recordContext) Key() []byte              { return c.key }
func (c *recordContext) Now() time.Time           { return c.now }
func (c *recordContext) Context() context.Context { return c.ctx }
func (c *recordContext) Task() int32              { return c.t.p }
func (c *recordContext) OutputTopic() string      { return c.in.cfg.OutputTopic }

func (c *recordContext) Emit(key, value []byte, headers ...api.Header) {
	c.EmitTo(c.in.cfg.OutputTopic, key, value, headers...)
}

func (c *recordContext) EmitTo(topic string, key, value []byte, headers ...api.Header) {
	c.out = append(c.out, &kgo.Record{Topic: topic, Key: key, Value: value, Headers: kgoHeaders(headers)})
}

func (c *recordContext) EmitToPartition(topic string, partition int32, key, value []byte, headers ...api.Header) {
	c.out = append(c.out, &kgo.Record{Topic: topic, Partition: partition, Context: explicitCtx, Key: key, Value: value, Headers: kgoHeaders(headers)})
}

func kgoHeaders(hs []api.Header) []kgo.RecordHeader {
	if len(hs) == 0 {
		return nil
	}
	out := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}

func apiRecord(r *kgo.Record) *api.Record {
	var hs []api.Header
	if len(r.Headers) > 0 {
		hs = make([]api.Header, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = api.Header{Key: h.Key, Value: h.Value}
		}
	}
	return &api.Record{Key: r.Key, Value: r.Value, Headers: hs, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp}
}

// Dead-letter headers say where a record came from and why it failed.
const (
	HeaderError     = "sluice.error"
	HeaderStage     = "sluice.stage"
	HeaderJob       = "sluice.job"
	HeaderTopic     = "sluice.source.topic"
	HeaderPartition = "sluice.source.partition"
	HeaderOffset    = "sluice.source.offset"
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
