package pgsink

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/txsink"
)

// BenchmarkEpoch measures one task's epoch into the table both ways the
// issue weighs, per epoch of rows keys:
//
//   - prepare: the sink's path, BEGIN + audit row + rows (one round trip),
//     PREPARE TRANSACTION, then COMMIT PREPARED after Kafka's commit;
//   - fenced: one ordinary transaction, BEGIN + audit row + rows + COMMIT
//     (the epoch-fenced upsert: one phase, which gives up exactly-once for
//     inserts and shows rows of epochs Kafka then aborts).
//
// go test -run '^$' -bench Epoch ./txsink/pgsink
func BenchmarkEpoch(b *testing.B) {
	// Durable as a production server is: PREPARE's cost is mostly its
	// flushes.
	srv := pgtest.Start(b, "fsync = on")
	dbs := 0
	for _, rows := range []int{1, 2500} {
		for _, mode := range []string{"prepare", "fenced"} {
			b.Run(fmt.Sprintf("%s-%drows", mode, rows), func(b *testing.B) {
				dbs++ // a sub-benchmark runs once per b.N tried
				cfg := aggConfig(srv.Database(b, fmt.Sprintf("%s%d_%d", mode, rows, dbs)))
				s := open(b, cfg)
				ctx := context.Background()
				conn, err := pgx.Connect(ctx, cfg.URL)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Close(ctx)
				b.ResetTimer()
				for i := range b.N {
					txn := s.Begin(0).(*epochTxn)
					for k := range rows {
						txn.Write(row("k"+strconv.Itoa(k), int64(i)))
					}
					id := txsink.TxnID{App: "app", Task: 0, Epoch: uint64(i + 1), Nonce: "b"}
					if mode == "prepare" {
						if err := txn.PreCommit(ctx, id); err != nil {
							b.Fatal(err)
						}
						if err := s.Commit(ctx, id); err != nil {
							b.Fatal(err)
						}
						continue
					}
					batch := &pgx.Batch{}
					batch.Queue("BEGIN")
					batch.Queue("INSERT INTO "+s.audit+` (app, task, epoch, txn, "table", rows) VALUES ($1, $2, $3, $4, $5, $6)`,
						"app", id.Task, int64(id.Epoch), id.String(), s.cfg.Table, int64(rows))
					batch.Queue(s.write, txn.columnArrays(txn.rows)...)
					batch.Queue("COMMIT")
					if err := conn.SendBatch(ctx, batch).Close(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/epoch")
			})
		}
	}
}
