// Package sluicetest runs a Sluice job in a unit test, the way goka's tester
// and Flink's operator test harnesses do, but against a real Kafka protocol:
// an in-process kfake cluster, a real instance of the engine, real
// transactions. A test feeds records with timestamps, moves processing
// time with a fake clock, waits until everything is committed, reads the
// committed output, side outputs and dead letters as a read_committed
// consumer would, and can crash the instance and start its successor.
//
//	func TestReminder(t *testing.T) {
//		h := sluicetest.New(t, job, sluicetest.Options{})
//		h.Send([]byte("ann"), []byte("add"), time.Time{})
//		h.Settle()                    // processed and committed
//		h.Advance(30 * time.Minute)   // processing-time timers become due
//		h.Settle()                    // and have fired and committed
//		out := h.Output()             // committed records, partition then offset order
//		h.Kill()                      // a crash: the open epoch is lost
//		h.Restart()                   // the successor restores and replays
//	}
//
// The package owns the test cluster (its topics: Options.InputTopics,
// InputTopic by default, OutputTopic,
// DeadLetterTopic, one per side output named after its tag, Options.Topics),
// the processing-time clock, and the lifecycle of one instance at a time:
// same app id, instance id and state directory across restarts, stopped at
// the end of the test. Every wait polls a condition until Options.Timeout;
// none sleeps for a fixed time.
//
// What it does not do: run several instances at once (so no rebalances
// between members), inject broker faults, or move the wall clock, on which
// epochs, transactions and group sessions keep running. An event-time job's
// timers fire as its watermark moves, which only records sent with later
// timestamps do: Advance moves processing time, never event time.
package sluicetest
