package sluice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/kstate"
)

// Timers are state (kstate stores them under their own key kind, ordered by
// domain, time and key), so registering and deleting one takes part in the
// record's and the epoch's write-sets like any other write. Firing one is
// handled like a record:
//
//   - The timer is removed and Job.OnTimer runs, both in the open epoch;
//     its writes and outputs commit with it. A timer that fired in a
//     committed epoch is gone from the backend and the changelog, so it
//     never fires again; one that fired in an aborted epoch is still there
//     and fires again on the replay. A timer registered in an aborted epoch
//     never existed.
//   - Event-time timers fire after the record that moved the watermark past
//     them, before the next record, all of them: the order of records and
//     timers is then the same on every replay. A job with Prefetch is the
//     exception: its batch was computed before it, so its event-time timers
//     fire after the batch, between polls (refreshEventTime), at most
//     Options.MaxPollRecords an iteration. Processing-time timers fire
//     between polls, at most Options.MaxPollRecords per iteration, so a burst
//     of them does not starve the input.
//   - Nothing is scanned while no timer is due: each task keeps the
//     earliest time registered per domain (a lower bound: a deleted timer
//     leaves it early, which costs one scan when it passes).

// timerDomains are the domains in firing order within an iteration.
var timerDomains = [...]kstate.TimeDomain{kstate.EventTime, kstate.ProcessingTime}

// never is the next-timer time of a domain with no timer.
const never = math.MaxInt64

// taskTimers is what a task knows about its timers without scanning (the
// committed count per domain is the backend's Stats).
type taskTimers struct {
	next [3]int64 // per domain: earliest registered time, unix ms (a lower bound), or never
}

func domainLabel(d kstate.TimeDomain) string {
	if d == kstate.EventTime {
		return "event"
	}
	return "processing"
}

// loadTimers finds the earliest timer per domain when the task starts.
func (t *task) loadTimers() error {
	for _, d := range timerDomains {
		if err := t.refreshNext(d); err != nil {
			return err
		}
	}
	return nil
}

// refreshNext sets the domain's next time from the store (write-sets
// included), after a firing or an abort changed what is registered.
func (t *task) refreshNext(d kstate.TimeDomain) error {
	tm, ok, err := kstate.NextTimer(t.store, d)
	if err != nil {
		return fmt.Errorf("task %d: next %s timer: %w", t.p, d, err)
	}
	t.timers.next[d] = never
	if ok {
		t.timers.next[d] = tm.At.UnixMilli()
	}
	return nil
}

// timerService is the Context's Timers: the record context itself, so
// handing it out allocates nothing.
type timerService recordContext

func (c *recordContext) Timers() Timers { return (*timerService)(c) }

func (s *timerService) RegisterEventTime(at time.Time) { s.register(kstate.EventTime, at) }
func (s *timerService) RegisterProcessingTime(at time.Time) {
	s.register(kstate.ProcessingTime, at)
}
func (s *timerService) DeleteEventTime(at time.Time) {
	kstate.DeleteTimer((*recordContext)(s), kstate.EventTime, at)
}
func (s *timerService) DeleteProcessingTime(at time.Time) {
	kstate.DeleteTimer((*recordContext)(s), kstate.ProcessingTime, at)
}

func (s *timerService) register(d kstate.TimeDomain, at time.Time) {
	c := (*recordContext)(s)
	job := &c.in.cfg.Job
	switch {
	case job.OnTimer == nil:
		c.t.store.Fail(fmt.Errorf("job %s registers a timer but has no OnTimer", job.Name))
		return
	case d == kstate.EventTime && !job.EventTime:
		c.t.store.Fail(fmt.Errorf("job %s registers an event-time timer but does not declare EventTime", job.Name))
		return
	}
	kstate.RegisterTimer(c, d, at)
}

// noteRegistered lowers the task's next times to the timers registered by
// the record or timer just handled, through the Context or kstate alike.
func (t *task) noteRegistered() {
	for _, d := range timerDomains {
		if ms, ok := t.store.TakeTimerFloor(d); ok {
			t.timers.next[d] = min(t.timers.next[d], ms)
		}
	}
}

// eventTimersDue reports whether the watermark passed an event-time timer
// of the task that has not fired yet.
func (t *task) eventTimersDue() bool {
	return t.clock != nil && t.clock.wm != noTime && t.clock.wm >= t.timers.next[kstate.EventTime]
}

// fireEventTimers fires the task's event-time timers the watermark passed.
func (l *loop) fireEventTimers(t *task) (int, error) {
	if !t.eventTimersDue() {
		return 0, nil
	}
	return l.fireDue(t, kstate.EventTime, t.clock.wm, 0)
}

// fireProcessingTimers fires due processing-time timers across tasks, at
// most budget of them, and reports whether any fired.
func (l *loop) fireProcessingTimers(budget int) (bool, error) {
	now := l.in.clock.Now().UnixMilli()
	due := false
	for _, t := range l.tasks {
		due = due || t.timers.next[kstate.ProcessingTime] <= now
	}
	if !due {
		return false, nil
	}
	fired := 0
	for _, p := range l.taskList() {
		t := l.tasks[p]
		if fired >= budget || t.timers.next[kstate.ProcessingTime] > now {
			continue
		}
		n, err := l.fireDue(t, kstate.ProcessingTime, now, budget-fired)
		fired += n
		if err != nil {
			return fired > 0, err
		}
	}
	return fired > 0, nil
}

// sweepTTL removes expired state (kstate.WithTTL) from each task, at most
// Options.TTLSweepEntries entries examined per task per checkpoint interval,
// idle or not: the deletes join the open epoch and reach the changelog as
// tombstones when it commits.
func (l *loop) sweepTTL() error {
	in := l.in
	now := in.clock.Now()
	wall := time.Now()
	for _, t := range l.tasks {
		if wall.Sub(t.sweptAt) < in.cfg.Checkpoint.Interval {
			continue
		}
		// A scan waits for the task's apply (kstate.Store.ApplyBehind):
		// the sweep waits for the next iteration instead. A failed
		// apply is settleApply's to report.
		if done, _ := t.store.TrySettle(); !done {
			continue
		}
		t.sweptAt = wall
		next, removed, err := kstate.SweepExpired(t.store, now, t.sweepCursor, in.cfg.TTLSweepEntries)
		if err != nil {
			return fmt.Errorf("task %d: sweep expired state: %w", t.p, err)
		}
		t.sweepCursor = next
		if removed == 0 {
			continue
		}
		in.m.ttlExpired.Add(float64(removed))
		if err := l.begin(); err != nil {
			return err
		}
		if err := l.run(l.coord.Work(time.Now())); err != nil {
			return err
		}
	}
	return nil
}

// refreshEventTime moves the watermarks that idle inputs held back, and
// fires the event-time timers due by them; it reports whether any fired.
func (l *loop) refreshEventTime() (bool, error) {
	if !l.in.cfg.Job.EventTime || l.timersDeferred.Load() {
		// Deferred: a watermark moved now would be committed past
		// timers that did not fire.
		return false, nil
	}
	now := l.in.clock.Now()
	fired := false
	// A job with Prefetch fires its event-time timers here, after its
	// batches (processOne): at most a poll's worth an iteration across
	// tasks, as processing-time timers, so that a burst (a window closing
	// for many keys, a call each for the function job) leaves the loop
	// to end its epoch between; pollWait does not wait while some are due.
	budget, spent := 0, false // 0: no bound
	if l.in.cfg.Job.Prefetch != nil {
		budget = l.in.cfg.MaxPollRecords
	}
	for _, t := range l.tasks {
		// The watermark may move for idle inputs; and a processing-time
		// timer's handler may have registered an event-time timer the
		// watermark has already passed.
		if t.clock.idleMatters() {
			t.clock.advance(now)
		}
		if spent || !t.eventTimersDue() {
			continue
		}
		n, err := l.fireDue(t, kstate.EventTime, t.clock.wm, budget)
		fired = fired || n > 0
		if err != nil {
			return fired, err
		}
		if budget > 0 {
			budget -= n
			spent = budget <= 0
		}
	}
	return fired, nil
}

// fireDue fires t's timers of domain d at or before upTo (unix ms), in
// time and key order, at most limit of them when limit > 0. The caller
// tells the coordinator about the work (as process does for records), not
// fireDue: an epoch must not end in the middle of a polled batch.
func (l *loop) fireDue(t *task, d kstate.TimeDomain, upTo int64, limit int) (int, error) {
	const batch = 512
	fired := 0
	for (limit <= 0 || fired < limit) && !l.timersDeferred.Load() {
		n := batch
		if limit > 0 {
			n = min(n, limit-fired)
		}
		due, err := kstate.DueTimers(t.store, d, time.UnixMilli(upTo), n)
		if err != nil {
			return fired, fmt.Errorf("task %d: due %s timers: %w", t.p, d, err)
		}
		if len(due) == 0 {
			break
		}
		for _, tm := range due {
			ok, err := kstate.HasTimer(t.store, tm)
			if err != nil {
				return fired, fmt.Errorf("task %d: read timer: %w", t.p, err)
			}
			if !ok {
				continue // deleted by a timer fired before it
			}
			if err := l.fireOne(t, tm); err != nil {
				return fired, err
			}
			if l.timersDeferred.Load() {
				break
			}
			fired++
		}
	}
	return fired, t.refreshNext(d)
}

// fireOne fires one timer in the open epoch.
func (l *loop) fireOne(t *task, tm kstate.Timer) error {
	in := l.in
	if err := l.begin(); err != nil {
		return err
	}
	t.timersFired.Inc()
	ref := inputRef{timer: string(kstate.TimerKey(tm))}
	var ps *poison
	if len(t.poison) > 0 {
		ps = t.poison[ref]
	}
	// Removed first, so that OnTimer may register the same timer again.
	kstate.RemoveTimer(t.store, tm)
	if ps != nil && ps.confirmed {
		t.store.CommitRecord()
		return l.deadLetterEmit(t, ref, in.timerDeadLetter(t, tm, ps.err, "emit"), ps)
	}
	rc := &t.rc
	rc.ctx, rc.in, rc.key, rc.now, rc.ts, rc.out = l.ctx, in, tm.Key, in.clock.Now(), tm.At, rc.out[:0]
	rc.wall = in.outputStamp(rc.now)
	rc.rows = rc.rows[:0] // sink rows (sink.go)
	defer clear(rc.out)
	var err error
	if in.cfg.Job.OnTimer == nil {
		// Registered by an earlier version of the job, restored with
		// the state: say so rather than drop it.
		err = fmt.Errorf("job %s has no OnTimer", in.cfg.Job.Name)
	} else {
		err = in.cfg.Job.OnTimer(rc, tm)
	}
	if err == nil {
		err = t.store.RecordErr()
	}
	t.noteRegistered()
	var ue *UnavailableError
	switch {
	case err == nil:
		l.commitHandled(t, ref, ps, rc.out)
	case l.ctx.Err() != nil && (errors.As(err, &ue) || errors.Is(err, context.Canceled)) && !IsFatal(err):
		// The instance shuts down and the handler's service call was cut
		// short: the timer stays (its removal is undone) for the next
		// start, no more timers fire, and the final checkpoint commits
		// the rest of the epoch. Only between polls, and only where no
		// record of this session could come after it in event time (a
		// processing-time timer, or any timer of a job with Prefetch,
		// whose timers fire between polls anyway): otherwise the
		// instance stops as for a Fatal error, and the epoch is
		// processed again at the next start.
		t.undo()
		if !l.betweenPolls || (tm.Domain == kstate.EventTime && in.cfg.Job.Prefetch == nil) {
			err = fmt.Errorf("job %s: task %d: %s timer at %s cut short by the shutdown: %w", in.cfg.Job.Name, t.p, tm.Domain, tm.At.UTC().Format(time.RFC3339Nano), err)
			in.log.Warn("the shutdown cut a timer short; stopping without the final checkpoint, the epoch is processed again at the next start", "err", err)
			return err
		}
		l.timersDeferred.Store(true)
		in.log.Info("timer left for the next start: its handler was cut short by the shutdown", "task", t.p, "domain", domainLabel(tm.Domain), "at", tm.At.UTC().Format(time.RFC3339Nano), "err", err)
	case IsFatal(err):
		t.undo()
		return fmt.Errorf("job %s: task %d: %s timer at %s: %w", in.cfg.Job.Name, t.p, tm.Domain, tm.At.UTC().Format(time.RFC3339Nano), err)
	default:
		// The timer stays removed: firing it again would fail again.
		t.undo()
		kstate.RemoveTimer(t.store, tm)
		t.store.CommitRecord()
		l.produceFor(t, ref, in.timerDeadLetter(t, tm, err, "timer"), true)
		t.processingErrors.Inc()
		t.dlq.Inc()
	}
	return nil
}

// Dead-letter headers of a timer that failed (besides error, stage, job
// and the task as source partition).
const (
	HeaderTimerDomain = "sluice.timer.domain" // "event" or "processing"
	HeaderTimerAt     = "sluice.timer.at"     // the timer's time, unix milliseconds
)

// timerDeadLetter is the dead letter of a timer whose handler failed: the
// timer's key, no value, headers naming the timer.
func (in *Instance) timerDeadLetter(t *task, tm kstate.Timer, err error, stage string) *kgo.Record {
	return &kgo.Record{Topic: in.cfg.DLQTopic, Key: tm.Key, Timestamp: tm.At, Headers: []kgo.RecordHeader{
		{Key: HeaderError, Value: []byte(err.Error())},
		{Key: HeaderStage, Value: []byte(stage)},
		{Key: HeaderJob, Value: []byte(in.cfg.Job.Name)},
		{Key: HeaderPartition, Value: []byte(t.label)},
		{Key: HeaderTimerDomain, Value: []byte(domainLabel(tm.Domain))},
		{Key: HeaderTimerAt, Value: []byte(strconv.FormatInt(tm.At.UnixMilli(), 10))},
	}}
}
