// Package barrier is the checkpoint coordinator of one Sluice processor
// instance: it decides when an epoch ends, waits for every task to reach the
// barrier, and sequences commit, apply and abort (DESIGN.md §3).
//
// It owns the epoch number, the phase of the checkpoint protocol, the
// consecutive failure count and the pending savepoint, shutdown and
// revocation requests. It owns no I/O: like etcd's raft, it is a state
// machine that the caller drives with events and that answers each with the
// Action to take next. It reads no clock (every event carries the time), so
// it is tested with a fake one, and it imports nothing but the standard
// library.
//
// # The loop
//
// The engine's loop goroutine owns the Coordinator. It feeds it events as
// they happen and carries out the actions it returns; carrying out an
// action ends in reporting its outcome, which is again an event. Actions
// arrive in protocol order, and each one's doc says what must be finished
// before its outcome is reported:
//
//	e.coord = barrier.New(cfg, clock.Now(), restoredEpoch+1)
//	e.do(e.coord.SetTasks(assigned))
//	for !e.coord.Done() {
//		select {
//		case now := <-ticker.C:
//			e.do(e.coord.Tick(now))
//		case rec := <-e.records: // only while dispatching: see ActEndEpoch
//			e.process(rec)
//			e.do(e.coord.Work(clock.Now()))
//		case task := <-e.handedOver: // a task reached the barrier
//			e.do(e.coord.TaskReady(task, clock.Now()))
//		case <-e.savepointAsked:
//			e.do(e.coord.RequestSavepoint(clock.Now()))
//		case <-e.revoking: // release once e.coord.Phase() is Processing again
//			e.do(e.coord.RequestRevoke(clock.Now()))
//		case <-sigterm:
//			e.do(e.coord.RequestShutdown(clock.Now()))
//		}
//	}
//
//	// do carries out act and the actions that follow from its outcome.
//	func (e *engine) do(act barrier.Action) {
//		for {
//			switch act.Kind {
//			case barrier.ActNone:
//				return
//			case barrier.ActEndEpoch:
//				e.stopDispatching()
//				for _, t := range act.Tasks {
//					e.tasks[t].barrier(act.Epoch) // drains, hands over, signals e.handedOver
//				}
//				return
//			case barrier.ActCommit:
//				// changelog records, then markers, flushed; only then EndTxn.
//				if err := e.commit(act.Epoch, act.Tasks); err != nil {
//					act = e.coord.CommitFailed(err, clock.Now())
//				} else {
//					act = e.coord.CommitDone(clock.Now())
//				}
//			case barrier.ActApply:
//				// Only here may the backends move: the epoch is committed.
//				if err := e.apply(act.Epoch, act.Tasks); err != nil {
//					act = e.coord.ApplyFailed(err, clock.Now())
//				} else {
//					act = e.coord.Applied(clock.Now())
//				}
//			case barrier.ActAbort:
//				e.abortTxn()
//				e.dropWriteSets()
//				e.rewind(act.Tasks) // to the committed offsets; backends untouched
//				act = e.coord.Aborted(clock.Now())
//			case barrier.ActFail:
//				e.fatal(act.Err) // exit; a restart restores
//				return
//			}
//		}
//	}
//
// An engine that commits on another goroutine reports CommitDone or
// CommitFailed from the loop when the result arrives, the same way as
// TaskReady; the coordinator only needs its events in order.
//
// # Epochs
//
// Epoch E ends at its barrier (ActEndEpoch) and E+1 begins there. E is
// committed in one Kafka transaction (ActCommit) and only then applied to
// the backends (ActApply; the engine starts the backends' writes and
// reports Applied, and they finish behind E+1's processing); Applied makes
// E+1 current. If E fails (timeout,
// commit error, EpochFailed), ActAbort rewinds the tasks and, after Aborted,
// E starts over under the same number. An epoch without work is never
// committed on interval; savepoints commit even an empty one. At most one
// checkpoint is in flight; records of E+1 may be processed while E commits
// (Work during Committing and Applying counts for E+1), but E+1's barrier
// comes only after E is applied.
//
// # Failures
//
// A failed checkpoint counts toward Config.TolerableFailures; one failure
// past it, and every event the phase does not allow, returns ActFail, after
// which the coordinator answers everything with the same ActFail. A caller
// bug in this protocol threatens exactly-once, so it is never ignored.
package barrier
