package sluice

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
)

// Broadcast state (Options.BroadcastTopic, Job.OnBroadcast, kstate.Broadcast).
//
// Every instance reads the broadcast topic whole, read_committed, and every
// running task applies each broadcast record to its own copy of the table
// through Job.OnBroadcast, inside its epoch: the change, what the handler
// emits and the task's position in the broadcast stream (operator entries
// kstate.PositionKey) commit in the same transaction as the task's other
// work, so a restore gives each task the table its committed outputs saw,
// and the position to go on from.
//
// Ordering rules:
//   - A task applies a broadcast record only if its position in that
//     partition is at or below the record's offset, and moves the position
//     past it in the same record-level write: a record is applied once per
//     task, whatever is read twice.
//   - The reader starts at the smallest position of the running tasks, and
//     starts there again whenever that may have moved back: a task was
//     installed (restored, maybe from further back) or an epoch aborted
//     (the tasks' positions went back with their write-sets).
//   - Broadcast records are applied between polls, never in the middle of a
//     polled batch; their order relative to the input's records is not
//     defined (as in Flink's BroadcastProcessFunction).

// BroadcastFunc handles a record of the broadcast topic (Options.BroadcastTopic)
// for one task. Only here may the job write broadcast state
// (kstate.Broadcast); it may emit as from Process. A non-nil error drops
// the record's changes and sends it to the dead-letter topic
// (sluice.stage=broadcast); an error wrapped with Fatal stops the instance.
type BroadcastFunc func(ctx Context, rec *Record) error

// broadcastReader reads the broadcast topic in a goroutine of its own.
type broadcastReader struct {
	cl     *kgo.Client
	recs   chan *kgo.Record
	cancel context.CancelFunc
	done   chan struct{}
}

// maxBroadcastPerIteration bounds the broadcast records the loop applies
// between two polls, so that a large table does not hold the input back.
const maxBroadcastPerIteration = 1000

// startBroadcast starts reading the broadcast topic at from (by partition;
// a partition not in it at its start).
func (in *Instance) startBroadcast(ctx context.Context, from map[int32]int64) (*broadcastReader, error) {
	offs := map[int32]kgo.Offset{}
	for p := range in.bcPartitions {
		offs[p] = kgo.NewOffset().AtStart()
		if o, ok := from[p]; ok {
			offs[p] = kgo.NewOffset().At(o)
		}
	}
	cl, err := kgo.NewClient(append(in.baseOpts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{in.cfg.BroadcastTopic: offs}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(250*time.Millisecond),
	)...)
	if err != nil {
		return nil, fmt.Errorf("sluice: broadcast reader: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &broadcastReader{cl: cl, recs: make(chan *kgo.Record, maxBroadcastPerIteration), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil || fs.IsClientClosed() {
				return
			}
			fs.EachError(func(topic string, p int32, err error) {
				in.log.Warn("reading the broadcast topic failed; retrying", "topic", topic, "partition", p, "err", err)
			})
			for _, rec := range fs.Records() {
				select {
				case r.recs <- rec:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	wake := in.wakeLoop
	go func() {
		// A record waiting while the loop polls an idle input should
		// not wait for the poll to time out.
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if len(r.recs) > 0 {
					wake()
				}
			}
		}
	}()
	return r, nil
}

func (r *broadcastReader) stop() {
	r.cancel()
	r.cl.Close()
	<-r.done
}

// position is task t's next offset in partition p of the broadcast topic,
// as its state (with the open epoch) says; -1 when it has applied none.
func (t *task) position(p int32) (int64, error) {
	v, ok, err := t.store.Get(kstate.PositionKey(p))
	if err != nil || !ok {
		return -1, err
	}
	return kstate.DecodePosition(v)
}

// applyBroadcast applies the broadcast records read since the last
// iteration to every running task (see the ordering rules above).
func (l *loop) applyBroadcast() error {
	in := l.in
	if in.cfg.BroadcastTopic == "" || (l.coord.Phase() != barrier.Processing && l.pipe == nil) {
		return nil // (during an overlap, records join the epoch being processed: pipelined.go)
	}
	if len(l.tasks) == 0 {
		if l.bc != nil {
			l.bc.stop()
			l.bc = nil
		}
		return nil
	}
	if l.bc == nil || l.bcRestart {
		if l.bc != nil {
			l.bc.stop()
		}
		from := map[int32]int64{}
		for _, t := range l.tasks {
			for p := range in.bcPartitions {
				pos, err := t.position(p)
				if err != nil {
					return fmt.Errorf("task %d: broadcast position: %w", t.p, err)
				}
				if cur, ok := from[p]; !ok || pos < cur {
					from[p] = pos
				}
			}
		}
		for p, pos := range from {
			if pos < 0 {
				delete(from, p) // from the start
			}
		}
		bc, err := in.startBroadcast(l.ctx, from)
		if err != nil {
			return err
		}
		l.bc, l.bcRestart = bc, false
	}
	applied := false
	for range maxBroadcastPerIteration {
		var r *kgo.Record
		select {
		case r = <-l.bc.recs:
		default:
		}
		if r == nil {
			break
		}
		for _, p := range l.taskList() {
			ok, err := l.applyOne(l.tasks[p], r)
			if err != nil {
				return err
			}
			applied = applied || ok
		}
	}
	if applied {
		return l.run(l.coord.Work(time.Now()))
	}
	return nil
}

// applyOne applies broadcast record r to task t, unless t applied it
// already.
func (l *loop) applyOne(t *task, r *kgo.Record) (bool, error) {
	in := l.in
	pos, err := t.position(r.Partition)
	if err != nil {
		return false, fmt.Errorf("task %d: broadcast position: %w", t.p, err)
	}
	if r.Offset < pos {
		return false, nil
	}
	if err := l.begin(); err != nil {
		return false, err
	}
	// The partition is part of the reference: a task applies records of
	// every broadcast partition (recordRef assumes the task's own).
	ref := inputRef{topic: fmt.Sprintf("%s/%d", r.Topic, r.Partition), offset: r.Offset}
	var ps *poison
	if len(t.poison) > 0 {
		if ps = t.poison[ref]; ps != nil && ps.confirmed {
			// Its outputs can never be produced (see poison.go): a
			// dead letter instead, and the position moves on.
			t.store.Put(kstate.PositionKey(r.Partition), kstate.EncodePosition(r.Offset+1))
			t.store.CommitRecord()
			return true, l.deadLetterEmit(t, ref, in.deadLetter(r, ps.err, "emit"), ps)
		}
	}
	rc := &t.rc
	rc.ctx, rc.in, rc.key, rc.now, rc.ts, rc.out = l.ctx, in, r.Key, in.clock.Now(), r.Timestamp, rc.out[:0]
	rc.wall = in.outputStamp(rc.now)
	rc.rows = rc.rows[:0]
	rc.broadcasting = true
	err = in.cfg.Job.OnBroadcast(rc, apiRecord(r))
	rc.broadcasting = false
	t.noteRegistered() // a timer it registered fires without waiting for an input record
	defer clear(rc.out)
	if err == nil {
		err = t.store.RecordErr()
	}
	switch {
	case err == nil:
		t.store.Put(kstate.PositionKey(r.Partition), kstate.EncodePosition(r.Offset+1))
		l.commitHandled(t, ref, ps, rc.out)
	case IsFatal(err):
		t.undo()
		return false, fmt.Errorf("job %s: task %d: broadcast %s/%d offset %d: %w", in.cfg.Job.Name, t.p, r.Topic, r.Partition, r.Offset, err)
	default:
		// The position moves on: applying it again would fail again.
		t.undo()
		t.store.Put(kstate.PositionKey(r.Partition), kstate.EncodePosition(r.Offset+1))
		t.store.CommitRecord()
		l.produceFor(t, ref, in.deadLetter(r, err, "broadcast"), true)
		t.processingErrors.Inc()
		t.dlq.Inc()
	}
	return true, nil
}

// checkBroadcast validates the broadcast options before any I/O.
func (c *Options) checkBroadcast() error {
	switch {
	case c.BroadcastTopic == "" && c.Job.OnBroadcast != nil:
		return fmt.Errorf("sluice: job %s has OnBroadcast but Options.BroadcastTopic is empty", c.Job.Name)
	case c.BroadcastTopic != "" && c.Job.OnBroadcast == nil:
		return fmt.Errorf("sluice: Options.BroadcastTopic %q: job %s has no OnBroadcast to apply it", c.BroadcastTopic, c.Job.Name)
	case c.BroadcastTopic != "" && slices.Contains(c.InputTopics, c.BroadcastTopic):
		return fmt.Errorf("sluice: Options.BroadcastTopic %q is also an input topic", c.BroadcastTopic)
	}
	return nil
}
