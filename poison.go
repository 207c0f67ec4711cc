package sluice

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Permanent produce failures. An output the broker or the client will never
// accept (larger than max.message.bytes, a timestamp out of the topic's
// bounds, a record the topic refuses) would abort its epoch on every
// replay, and nothing after it would ever commit.
// Such an input is a poison record: it goes to the dead-letter topic
// (stage "emit", the produce error in the headers), its state writes and
// other outputs are dropped, and the epoch is replayed without it.
//
// The broker fails a whole batch, so a permanent error names every record
// batched with the culprit. The first failure only makes its inputs
// suspects; on the replay each suspect's outputs are produced alone (flushed
// before and after), and only a suspect whose outputs fail again alone is
// dead-lettered. The rest go on as usual.

// inputRef names an input record of a task, or a timer of it (whose
// outputs can be poison too).
type inputRef struct {
	topic  string
	offset int64
	timer  string // the timer's physical key; topic and offset are then unset
}

func recordRef(r *kgo.Record) inputRef { return inputRef{topic: r.Topic, offset: r.Offset} }

// poison is what the task knows of an input whose output failed for good.
type poison struct {
	err       error
	confirmed bool  // its outputs failed when produced alone: dead-letter it
	dlqFailed int   // times its dead letter itself failed permanently
	dlqErr    error // why it failed the last time
}

// failedOutput is a permanent produce failure, as the promise saw it.
type failedOutput struct {
	task int32
	ref  inputRef
	err  error
	dlq  bool // the failed record was the input's dead letter
}

// isPermanent reports whether a produce error can never succeed on retry.
func isPermanent(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) ||
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) ||
		// A timestamp the topic's message.timestamp.before.max.ms or
		// after.max.ms refuses: outputs carry their input's event time.
		errors.Is(err, kerr.InvalidTimestamp)
}

// failures collects permanent produce failures from franz-go's promise
// goroutines for the loop.
type failures struct {
	mu   sync.Mutex
	list []failedOutput
}

func (f *failures) add(fo failedOutput) {
	f.mu.Lock()
	f.list = append(f.list, fo)
	f.mu.Unlock()
}

func (f *failures) peek() []failedOutput {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.list)
}

func (f *failures) take() []failedOutput {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := f.list
	f.list = nil
	return list
}

// produceFor adds r, an output or dead letter of the input ref, to the open
// epoch; a permanent failure is remembered against ref.
func (l *loop) produceFor(t *task, ref inputRef, r *kgo.Record, dlq bool) {
	c, ok := r.Context.(*outCtx)
	if !ok {
		// Not from a slab (a dead letter, which is rare): give it the
		// Context the promise reads.
		c = &outCtx{Context: context.Background(), explicit: isExplicit(r), task: t.p}
		r.Context = c
	}
	c.ref, c.dlq = ref, dlq
	l.send(r, l.outPromise)
}

// outPromised is the promise of every record produced by produceFor
// (l.outPromise, made once), the input taken from the record's outCtx.
func (l *loop) outPromised(r *kgo.Record, err error) {
	if err != nil {
		l.noteProduceErr(r, err)
		if c := r.Context.(*outCtx); isPermanent(err) {
			l.failed.add(failedOutput{task: c.task, ref: c.ref, err: err, dlq: c.dlq})
		}
	}
	l.recycled(r)
}

// learnsSomething reports whether the permanent failures of the epoch teach
// the replay something new: an input not yet suspected, or a dead letter
// that failed (its fallbacks are bounded). A commit refused without
// anything new counts as an ordinary failure, so that failures which come
// and go (a topic's limit lowered at run time) cannot make refusals repeat
// for ever.
func (l *loop) learnsSomething() bool {
	for _, f := range l.failed.peek() {
		if ps := l.in.poisonOf(f.task)[f.ref]; ps == nil || f.dlq {
			return true
		}
	}
	return false
}

// learnPoison turns the permanent failures of an aborted epoch into
// suspects (or, for dead letters, into a fallback) for its replay.
func (l *loop) learnPoison() {
	for _, f := range l.failed.take() {
		known := l.in.poisonOf(f.task)
		ps := known[f.ref]
		switch {
		case ps == nil && f.dlq:
			known[f.ref] = &poison{err: f.err, confirmed: true, dlqFailed: 1, dlqErr: f.err}
		case ps == nil:
			known[f.ref] = &poison{err: f.err}
		case f.dlq:
			ps.dlqFailed++
			ps.dlqErr = f.err
		default:
			ps.confirmed, ps.err = true, f.err
		}
		l.in.log.Warn("output failed permanently; its input is replayed as a suspect",
			"task", f.task, "topic", f.ref.topic, "offset", f.ref.offset, "timer", f.ref.timer != "", "dead_letter", f.dlq, "err", f.err)
	}
}

// produceAlone produces a suspect's outputs with nothing else in their
// batches and waits for them. A permanent failure confirms the suspect
// (the epoch is then aborted and replayed without it); success clears it.
func (l *loop) produceAlone(t *task, ref inputRef, ps *poison, out []*kgo.Record) {
	ctx, cancel := context.WithTimeout(context.Background(), l.in.cfg.Checkpoint.Timeout)
	defer cancel()
	at := &kgo.Record{Topic: ref.topic, Partition: t.p}
	if err := l.sess.Client().Flush(ctx); err != nil {
		l.noteProduceErr(at, fmt.Errorf("flush before a suspect's outputs: %w", err))
		return
	}
	var mu sync.Mutex
	var permanent, failed error
	for _, o := range out {
		l.sess.Produce(context.Background(), o, func(r *kgo.Record, err error) {
			defer recycle(r)
			if err == nil {
				return
			}
			l.noteProduceErr(r, err)
			mu.Lock()
			failed = err
			if isPermanent(err) {
				permanent = err
			}
			mu.Unlock()
		})
	}
	if err := l.sess.Client().Flush(ctx); err != nil {
		l.noteProduceErr(at, fmt.Errorf("flush of a suspect's outputs: %w", err))
		return
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case failed == nil:
		delete(t.poison, ref) // cleared: every output went through alone
		return
	case permanent == nil:
		return // a transient failure says nothing: still a suspect
	}
	ps.confirmed, ps.err = true, permanent
	l.refused.Store(true)
	l.in.log.Warn("output fails alone too; its input goes to the dead-letter topic on the replay",
		"task", t.p, "topic", ref.topic, "offset", ref.offset, "timer", ref.timer != "", "err", permanent)
}

// deadLetterEmit sends dl, the dead letter of a confirmed poison input or
// timer, to the dead-letter topic. If its dead letter failed permanently
// before (the DLQ topic accepts less than the input topic did), it goes
// stamped with the time of its produce instead of its input's: refused for
// its timestamp (an input or timer time out of the topic's bounds, as
// that of an output refused for it can be), with its key and value; else
// without them. If even that failed, the instance stops: no record can be
// written there.
func (l *loop) deadLetterEmit(t *task, ref inputRef, dl *kgo.Record, ps *poison) error {
	switch {
	case ps.dlqFailed == 1:
		dl.Timestamp = time.Time{} // franz-go stamps it when produced
		if !errors.Is(ps.dlqErr, kerr.InvalidTimestamp) {
			dl.Key, dl.Value = nil, nil
			dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: HeaderTruncated, Value: []byte("key and value left out: the dead-letter topic refused them")})
		}
	case ps.dlqFailed > 1:
		return fmt.Errorf("sluice: task %d offset %d: the dead-letter topic %s refuses even a record without key and value: %w", t.p, ref.offset, l.in.cfg.DLQTopic, ps.err)
	}
	l.produceFor(t, ref, dl, true)
	t.dlq.Inc()
	t.processingErrors.Inc()
	return nil
}

// poisonOf returns the poison inputs known for task p. Only the loop
// goroutine calls it; the map outlives sessions.
func (in *Instance) poisonOf(p int32) map[inputRef]*poison {
	if in.poison == nil {
		in.poison = map[int32]map[inputRef]*poison{}
	}
	m := in.poison[p]
	if m == nil {
		m = map[inputRef]*poison{}
		in.poison[p] = m
	}
	return m
}

// prunePoison forgets inputs the task committed past, and timers that are
// gone from the committed store.
func (t *task) prunePoison() {
	for ref := range t.poison {
		if ref.timer != "" {
			if _, ok, err := t.store.Backend().Get([]byte(ref.timer)); err == nil && !ok {
				delete(t.poison, ref)
			}
			continue
		}
		if next, ok := t.committed[ref.topic]; ok && ref.offset < next {
			delete(t.poison, ref)
		}
	}
}
