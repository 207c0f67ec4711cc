package sluice

import (
	"sync"
	"sync/atomic"
)

// Tasks in parallel (Options.Parallelism): the records of a poll are split
// by task, and up to Parallelism tasks process theirs at once, the loop
// goroutine being one of the workers. Kafka Streams' num.stream.threads
// does the same with a thread per group of tasks; here the workers share
// the instance's one transaction, so an epoch still commits every task at
// once.
//
// It is safe because processing a task's records touches what the task
// owns: its store and write-set, its offsets (next, committed, replayUntil),
// its timers and watermark, its record context and slabs, its sink epoch,
// its metrics. What the tasks share is made for it:
//
//   - the epoch's transaction opens once, in begin, under txnMu;
//   - the session's Produce may be called from any goroutine (franz-go),
//     and its promises keep failures in atomics and under failures.mu;
//   - budgetFull and refused are atomics;
//   - recycled output records come from a list under a mutex
//     (outSlots, task.record), each task taking them into its own stack;
//   - the job's functions and Options.Clock are documented to be called
//     concurrently for different tasks (Options.Parallelism), and an
//     Options.Sink's methods from any goroutine (txsink.EpochSink).
//
// Nothing that processing calls runs the coordinator (run refuses to while
// l.processing is set): the epoch, the task set and the consumer's
// positions stay as they are until every worker is done, and only then
// does the loop act on what they did (afterProcess).
//
// A poll is processed by the loop goroutine alone when the job has a
// Prefetch (whether its service is unavailable is the loop's to track) or a
// task has a suspect input (poison.go: a suspect's outputs are produced with
// nothing else in their batches, which other tasks' outputs in flight would
// break).

// taskWork processes the poll's records of task i of n; rewind receives
// where the ones it leaves are fetched again from, and worked says whether
// it processed any.
type taskWork func(i int, rewind offsets) (worked bool, err error)

// eachTask runs work over the poll's n tasks, in parallel when l.parallel
// says so, and merges what they report into rewind. The first error (in
// task order) is returned; a worker stops taking tasks once any task
// failed, as the serial loop stops at the failing task.
func (l *loop) eachTask(n int, rewind offsets, work taskWork) (worked bool, err error) {
	l.processing.Store(true)
	defer l.processing.Store(false)
	workers := min(l.in.cfg.Parallelism, n)
	if workers <= 1 || !l.parallel() {
		for i := range n {
			w, err := work(i, rewind)
			worked = worked || w
			if err != nil {
				return worked, err
			}
		}
		return worked, nil
	}
	type result struct {
		rewind offsets
		worked bool
		err    error
	}
	results := make([]result, n)
	inParallel(workers, n, func(i int) bool {
		r := &results[i]
		r.rewind = offsets{}
		r.worked, r.err = work(i, r.rewind)
		return r.err != nil
	})
	for _, r := range results {
		for topic, ps := range r.rewind {
			for p, off := range ps {
				rewind.set(topic, p, off.Offset)
			}
		}
		worked = worked || r.worked
		if err == nil {
			err = r.err
		}
	}
	return worked, err
}

// inParallel calls do(i) for every i below n on up to workers goroutines,
// the calling one among them, each taking the next i not taken yet; once
// a call returns true (stop), no further i is taken. It returns when every
// call has.
func inParallel(workers, n int, do func(i int) (stop bool)) {
	var next atomic.Int64
	var stopped atomic.Bool
	take := func() {
		for !stopped.Load() {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			if do(i) {
				stopped.Store(true)
			}
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			take()
		}()
	}
	take()
	wg.Wait()
}

// taskWorkers is how many tasks the instance's configuration lets
// process at once: Options.Parallelism, or 1 for a job with a Prefetch
// (whether its service is unavailable is the loop's to track). The fetch
// bound grows with it (fetchPartitionBytes), and follows the input's
// batches when it is above 1 (fetchBound).
func (o *Options) taskWorkers() int {
	if o.Job.Prefetch != nil {
		return 1
	}
	return max(1, o.Parallelism)
}

// parallel reports whether the next poll's tasks may be processed in
// parallel: taskWorkers allows it and no running task has a suspect
// input or timer (poison.go).
func (l *loop) parallel() bool {
	if l.in.cfg.taskWorkers() <= 1 {
		return false
	}
	for _, t := range l.tasks {
		if len(t.poison) > 0 {
			return false
		}
	}
	return true
}

// pollRecords is how many records one poll takes: enough for each task
// processed at once when they are processed in parallel, since a buffered
// fetch is handed out partition by partition (a poll of MaxPollRecords
// mostly holds one task's records). The fetch bound grows with
// Parallelism too (fetchPartitionBytes), and to the input's largest
// batch (fetchBound), so that a response holds several partitions'
// records.
func (l *loop) pollRecords() int {
	if l.parallel() {
		return l.in.cfg.MaxPollRecords * l.in.cfg.Parallelism
	}
	return l.in.cfg.MaxPollRecords
}
