package barrier_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/barrier"
)

// The engine's loop in miniature: records and ticks go in, actions come out,
// and carrying out each action ends in the event that reports its outcome.
// The second commit fails once; the epoch is retried under the same number.
func Example() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cfg := barrier.Config{Interval: 100 * time.Millisecond, Timeout: 10 * time.Second, TolerableFailures: 3}
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	coord := barrier.New(cfg, now, 1)
	commitErrs := []error{nil, errors.New("EndTxn: COORDINATOR_NOT_AVAILABLE")}

	do := func(act barrier.Action) {
		for act.Kind != barrier.ActNone {
			fmt.Println(act)
			switch act.Kind {
			case barrier.ActEndEpoch:
				// Each task drains to the barrier and hands over its
				// write-set; here they all do so at once.
				for _, task := range act.Tasks {
					act = coord.TaskReady(task, now)
				}
			case barrier.ActCommit:
				// Changelog records and markers, flushed; then EndTxn.
				var err error
				if len(commitErrs) > 0 {
					err, commitErrs = commitErrs[0], commitErrs[1:]
				}
				if err != nil {
					act = coord.CommitFailed(err, now)
				} else {
					act = coord.CommitDone(now)
				}
			case barrier.ActApply:
				// Write-sets into the backends, only now.
				act = coord.Applied(now)
			case barrier.ActAbort:
				// Abort the transaction, drop write-sets, rewind.
				act = coord.Aborted(now)
			case barrier.ActFail:
				return
			}
		}
	}

	do(coord.SetTasks([]int32{0, 1}))
	for range 10 {
		now = now.Add(40 * time.Millisecond)
		do(coord.Work(now)) // a record was processed
		do(coord.Tick(now))
	}
	do(coord.RequestShutdown(now))
	fmt.Println("done:", coord.Done(), "next epoch:", coord.Epoch())

	// Output:
	// end-epoch epoch=1 tasks=0,1 reason=interval
	// commit epoch=1 tasks=0,1 reason=interval
	// apply epoch=1 tasks=0,1 reason=interval
	// end-epoch epoch=2 tasks=0,1 reason=interval
	// commit epoch=2 tasks=0,1 reason=interval
	// abort epoch=2 tasks=0,1 reason=commit-failed err="barrier: checkpoint of epoch 2 (interval) failed (commit-failed): EndTxn: COORDINATOR_NOT_AVAILABLE"
	// end-epoch epoch=2 tasks=0,1 reason=interval
	// commit epoch=2 tasks=0,1 reason=interval
	// apply epoch=2 tasks=0,1 reason=interval
	// end-epoch epoch=3 tasks=0,1 reason=shutdown
	// commit epoch=3 tasks=0,1 reason=shutdown
	// apply epoch=3 tasks=0,1 reason=shutdown
	// done: true next epoch: 4
}
