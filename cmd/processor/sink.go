package main

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/txsink"
	"github.com/sluicehq/sluice/txsink/pgsink"
)

// sinkTable is a built-in job's table in SLUICE_SINK=postgres (DESIGN §7).
type sinkTable struct {
	columns []pgsink.Column
	key     []string // upsert by these; none: insert
}

// sinkTables are the jobs that write rows, with their tables: aggregate
// upserts one row per key, echo inserts one row per input record.
var sinkTables = map[string]sinkTable{
	"aggregate": {
		columns: pgsink.Named(jobs.AggregateColumns, pgsink.Text, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt),
		key:     jobs.AggregateColumns[:1],
	},
	"echo": {
		columns: pgsink.Named(jobs.EchoColumns, pgsink.Text, pgsink.Integer, pgsink.BigInt, pgsink.Bytea, pgsink.Bytea),
	},
}

// maxSinkAppIDLen keeps txsink.TaskPrefix within the 150 bytes
// sluice.Options allows with a sink.
const maxSinkAppIDLen = 130

func (c Config) validateSink(v *validation, job JobSpec) {
	v.check("SLUICE_SINK", c.Sink == "" || c.Sink == "postgres", "postgres, or empty for none")
	if c.Sink == "" {
		return
	}
	if job.Name != "" {
		v.check("SLUICE_SINK", job.Sink, "empty: job "+job.Name+" writes no rows (aggregate and echo do)")
	}
	// PostgreSQL's transaction ids hold 200 bytes: the app id, the task,
	// the epoch and a nonce (txsink.TxnID).
	v.check("SLUICE_APP_ID", len(c.AppID) <= maxSinkAppIDLen, fmt.Sprintf("at most %d characters with SLUICE_SINK=postgres (they name its prepared transactions)", maxSinkAppIDLen))
	v.check("SLUICE_GUARANTEE", c.Guarantee == "exactly_once", "exactly_once: SLUICE_SINK=postgres commits each epoch's rows with the epoch's Kafka transaction")
	_, err := pgconn.ParseConfig(c.PostgresURL)
	v.check("SLUICE_POSTGRES_URL", c.PostgresURL != "" && err == nil, "a PostgreSQL connection string such as postgres://user:password@host:5432/db")
	v.check("SLUICE_POSTGRES_TABLE", validTable(c.PostgresTable), "a table name or schema.table (each part 1 to 63 bytes)")
}

func validTable(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || len(p) > 63 || strings.ContainsRune(p, 0) {
			return false
		}
	}
	return true
}

// newSink is the sink SLUICE_SINK names, nil for none. Nothing connects
// until the instance runs (it waits for the database like the brokers).
func newSink(c Config, log *slog.Logger) txsink.EpochSink {
	if c.Sink != "postgres" {
		return nil
	}
	t := sinkTables[c.Job]
	s, err := pgsink.New(pgsink.Config{URL: c.PostgresURL, App: c.AppID, Table: c.PostgresTable, Columns: t.columns, Key: t.key, Logger: log})
	if err != nil {
		panic("processor: the sink's configuration passed validation but not pgsink: " + err.Error())
	}
	return s
}
