// Package txsink owns the instance's link to Kafka for one group
// membership: it polls input, produces outputs and changelog records, and
// ends each epoch by committing them together with the input offsets.
//
// Exactly-once ends an epoch with one Kafka transaction: outputs, changelog
// and TxnOffsetCommit (carrying the group generation, KIP-447) commit or
// abort together. At-least-once flushes outputs and changelog, then commits
// the offsets: a crash in between replays the epoch.
//
// EpochSink (epoch.go) is the two-phase interface of a sink outside Kafka
// that joins the epoch: each task's rows are prepared before EndTxn and
// committed after it, and a restore finishes what the epoch's marker says.
// Its ordering rules are written beside it; txsink/pgsink implements it for
// PostgreSQL.
package txsink
