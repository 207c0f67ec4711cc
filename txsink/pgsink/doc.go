// Package pgsink is a txsink.EpochSink into a PostgreSQL table: each task's
// rows of an epoch are written in a database transaction of their own,
// together with a row of the audit table sluice_sink_epochs (primary key
// app, task, epoch, so the audit shows each epoch applied once), prepared
// with PREPARE TRANSACTION before Kafka's EndTxn and made visible with
// COMMIT PREPARED after it (docs/sinks.md has the crash table and why two
// phases rather than an epoch-fenced upsert).
//
// A table is written in one of two modes: upsert (Config.Key names its
// primary key: the epoch's rows are merged per key in memory, last one
// wins, and one row per key is written at pre-commit) or insert (no key:
// every row is inserted).
//
//	s, err := pgsink.New(pgsink.Config{URL: url, App: "orders", Table: "totals",
//		Columns: pgsink.Named([]string{"key", "count"}, pgsink.Text, pgsink.BigInt),
//		Key:     []string{"key"}})
//	err = s.Setup(ctx) // creates the tables if missing, checks their shape
//	txn := s.Begin(task)
//	txn.Write([]any{"k", int64(3)})
//	err = txn.PreCommit(ctx, id) // prepared: durable, not visible
//	// ... Kafka's EndTxn commits ...
//	err = s.Commit(ctx, id)
package pgsink
