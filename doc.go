// Package sluice is exactly-once, stateful stream processing for Go services
// on Kafka.
//
// Declare a Job with a ProcessFunc (and an OnTimer if it sets timers), keep
// keyed state with the descriptors of package kstate, and run it with New
// and Instance.Run:
//
//	var count = kstate.Value[int64]("count", kstate.Int64())
//
//	job := sluice.Job{Name: "count", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
//		n, _, err := count.Get(ctx)
//		if err != nil {
//			return err
//		}
//		if err := count.Set(ctx, n+1); err != nil {
//			return err
//		}
//		ctx.Emit(rec.Key, []byte(strconv.FormatInt(n+1, 10)))
//		return nil
//	}}
//	inst, err := sluice.New(sluice.Options{
//		Brokers: []string{"kafka:9092"}, AppID: "counter", InstanceID: "counter-1",
//		Job: job, InputTopics: []string{"clicks"}, OutputTopic: "counts",
//	})
//	err = inst.Run(ctx)
//
// Each epoch's state changes, outputs and input offsets commit in one Kafka
// transaction; a read_committed consumer of the output sees every input
// reflected exactly once. Options has the defaults the processor binary
// uses; only the fields above are required.
//
// # How an instance runs
//
// An Instance is a member of the app's consumer group. It owns the tasks
// (one per input partition number) and the epoch protocol that commits each
// task's state changes, outputs and input offsets in one Kafka transaction.
// One goroutine, the loop, owns every running task's state; a restoring
// task belongs to its restore goroutine until it is handed to the loop:
//
//	for {
//		install restored tasks; handle assignment changes
//		records := session.PollRecords()
//		for each record: task.process(record)   // writes go to the epoch write-set
//		fire due timers                         // likewise, in the open epoch
//		if coordinator says end the epoch:
//			per task: produce dirty keys, then the epoch marker   // pre-commit
//			session.End(commit)                                   // flush, TxnOffsetCommit, EndTxn
//			committed? per task: apply write-set + meta in one bbolt tx
//			aborted?   per task: drop write-set, rewind to committed offsets
//		session.AllowRebalance()
//	}
//
// Local state advances only after the transaction commits, so a crash at
// any point leaves the backend at a committed epoch, and the changelog tail
// brings it to the newest one.
//
// Most failures are retried: the start-up with backoff, a broken session by
// building a new one. Refusals are not: a missing ACL or refused
// credentials stop Run with a *PermissionError or an *AuthError naming what
// is missing. Options.ACLs is the least-privilege set; every start-up ends
// by asking the brokers whether they grant it.
package sluice
