package sluice

import (
	"cmp"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
)

// The apply: once an epoch committed, each task's backend takes the
// epoch's write-set, on a goroutine of its own, while the loop goes on
// with the next epoch.
//
// Ordering rule: a write starts only after its epoch committed in Kafka
// (or, at-least-once, its offsets), and each is settled before the next
// write of its backend starts or the backend closes.

// apply moves every task that wrote a marker to the committed epoch and
// starts its backend's write; the loop goes on with the next epoch while
// the writes run (see applyTasks), and settleApply finishes the apply.
func (l *loop) apply(tasks []int32) barrier.Action {
	if err := l.applyTasks(tasks); err != nil {
		l.fatal = err
		return l.coord.ApplyFailed(err, time.Now())
	}
	if err := l.settleApply(false); err != nil {
		l.fatal = err
		return l.coord.ApplyFailed(err, time.Now())
	}
	return l.coord.Applied(time.Now())
}

// epochBehind is a committed epoch whose backend writes are under way.
type epochBehind struct {
	tasks  []*task
	ckptAt time.Time     // when its barrier was placed
	done   chan struct{} // closed when the last write returned
	doneAt time.Time     // when it was closed
	left   atomic.Int32  // writes not yet returned
}

// writeDone counts one of the epoch's writes as returned.
func (b *epochBehind) writeDone() {
	if b.left.Add(-1) == 0 {
		b.doneAt = time.Now()
		close(b.done)
	}
}

// applyTasks applies the committed epoch to the tasks that wrote a marker.
// Each task moves to the epoch at once (task.applied), and its backend's
// transaction (task.write) runs on a goroutine of its own, so that:
//
//   - the tasks' transactions run several at once: each task's store is
//     its own (a bbolt file, a map), and such a transaction is CPU
//     (bbolt's copy-on-write of the pages it touches) and two fsyncs, so
//     one after another the loop waited for the sum of them while a core,
//     or the disk, sat idle;
//   - the loop does not wait for them: it processes the next epoch while
//     they run, its stores reading the committed epoch from the write-set
//     taken aside (kstate.Store.ApplyBehind) until their backend has it.
//
// Nothing of the epoch protocol moves: the epoch committed in Kafka
// before its writes start, and after a crash each backend is at the epoch
// before or at this one (its changelog holds the epoch either way), as in
// the crash table. The next epoch's apply, a release, the session's end
// and every scan of a store wait for the writes first (settleApply,
// kstate.Store.Settle), so a backend never has two writes at once, and
// its scans never overlap its write. Only the write itself runs on those
// goroutines; the rest (the task's offsets, its poison, its clock, its
// metrics) stays on the loop goroutine, so nothing else of the task, the
// job's clock included, is used from two goroutines at once.
func (l *loop) applyTasks(tasks []int32) error {
	if err := l.settleApply(true); err != nil {
		return err
	}
	var todo []*task
	var metas []kstate.Meta
	for _, p := range tasks {
		if t := l.tasks[p]; t != nil && t.ending().marker != nil {
			todo = append(todo, t)
			metas = append(metas, t.epochMeta(l.in))
		}
	}
	b := &epochBehind{tasks: todo, ckptAt: l.ckptAt, done: make(chan struct{})}
	b.left.Store(int32(len(todo)) + 1) // one for this function, until every write started
	if l.applySem == nil {
		l.applySem = make(chan struct{}, applyConcurrency())
	}
	start := func(write func()) {
		go func() {
			l.applySem <- struct{}{}
			write()
			<-l.applySem
			b.writeDone()
		}()
	}
	var first error
	for i, t := range todo {
		if err := t.write(metas[i], start); err != nil {
			b.writeDone() // not started
			first = cmp.Or(first, err)
			continue
		}
		t.applied(l.in, metas[i])
		l.in.standbys.noteCopy(t.p, metas[i].ChangelogOffset, 0)
	}
	b.writeDone()
	l.behind = b
	return first
}

// settleApply finishes the apply of the epoch whose writes applyTasks
// started: it waits for them when wait is set (else it returns at once if
// they are still running), then ends each task's write (the store reads
// its backend again), publishes what the backends now hold, and counts the
// epoch applied (PointAfterApply, the checkpoint's duration). The first
// failed write, by task order, is returned: the backend is behind the
// changelog, and only a restart restores it.
func (l *loop) settleApply(wait bool) error {
	b := l.behind
	if b == nil {
		return nil
	}
	if wait {
		<-b.done
	} else {
		select {
		case <-b.done:
		default:
			return nil
		}
	}
	l.behind = nil
	var first error
	for _, t := range b.tasks {
		if err := t.store.Settle(); err != nil {
			first = cmp.Or(first, fmt.Errorf("task %d: apply epoch %d: %w", t.p, t.epoch, err))
			continue
		}
		t.settled(l.in)
	}
	if first != nil {
		return first
	}
	l.in.committedEpochs.Add(1)
	l.in.cfg.at(PointAfterApply)
	if !b.ckptAt.IsZero() {
		l.in.m.checkpointDuration.Observe(b.doneAt.Sub(b.ckptAt).Seconds())
	}
	return nil
}

// settleOrStop is settleApply for the loop outside an apply (each poll, a
// release, the session's end): a failed write stops the instance, with
// barrier.ErrApplyFailed, as a failed apply does through the coordinator.
func (l *loop) settleOrStop(wait bool) error {
	if err := l.settleApply(wait); err != nil {
		l.fatal = fmt.Errorf("%w: %w", barrier.ErrApplyFailed, err)
		return l.fatal
	}
	return nil
}

// applyConcurrency is how many tasks apply an epoch at once: the cores,
// and at least 2 so that one task's fsync overlaps another's pages.
func applyConcurrency() int { return max(2, runtime.GOMAXPROCS(0)) }
