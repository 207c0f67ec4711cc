// Package engine runs one processor instance: it owns the consumer-group
// membership, the tasks (one per input partition number) and the epoch
// protocol that commits each task's state changes, outputs and input
// offsets in one Kafka transaction.
//
// One goroutine, the loop, owns every running task's state. A restoring
// task belongs to its restore goroutine until it is handed to the loop. The
// loop is:
//
//	for {
//		install restored tasks; handle assignment changes
//		records := session.PollRecords()
//		for each record: task.process(record)   // writes go to the epoch write-set
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
// building a new one. Refusals are not (authz.go, authn.go): a missing ACL
// or refused credentials stop Run with a *PermissionError or an *AuthError
// naming what is missing. Config.ACLs is the least-privilege set; every
// start-up ends by asking the brokers whether they grant it.
package engine
