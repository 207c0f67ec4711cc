package pgsink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/txsink"
)

// chunkRows bounds the rows of one statement, so that one message to the
// server stays a few megabytes whatever the epoch's size.
const chunkRows = 20000

// epochTxn is one task's rows of one epoch, in memory until PreCommit.
type epochTxn struct {
	s    *Sink
	task int32
	rows [][]any
	// at maps a row's key to its place in rows (upsert mode): a later
	// row of the same key replaces it, so each key is written once.
	at  map[string]int
	buf []byte
}

// Begin starts a task's rows of an epoch.
func (s *Sink) Begin(task int32) txsink.EpochTxn {
	t := &epochTxn{s: s, task: task}
	if s.keyIdx != nil {
		t.at = map[string]int{}
	}
	return t
}

func (t *epochTxn) Len() int { return len(t.rows) }

// Write adds a row that Check accepted. In upsert mode a row replaces an
// earlier one of the same key: the table holds the last row of each key as
// of the epoch, and one write per key is far cheaper than one per row (see
// docs/sinks.md).
func (t *epochTxn) Write(row []any) {
	cols := t.s.cfg.Columns
	for i, v := range row {
		if isNull(v) {
			row[i] = nil
			continue
		}
		row[i], _ = normalize(cols[i], v)
	}
	if t.at == nil {
		t.rows = append(t.rows, row)
		return
	}
	k := t.key(row)
	if i, ok := t.at[k]; ok {
		t.rows[i] = row
		return
	}
	t.at[k] = len(t.rows)
	t.rows = append(t.rows, row)
}

// key encodes a row's key columns: the string itself for a single text key
// (the common case, no allocation beyond the map's), otherwise each value
// length-prefixed.
func (t *epochTxn) key(row []any) string {
	if len(t.s.keyIdx) == 1 {
		if s, ok := row[t.s.keyIdx[0]].(string); ok {
			return s
		}
	}
	b := t.buf[:0]
	for _, i := range t.s.keyIdx {
		switch v := row[i].(type) {
		case string:
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		case []byte:
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		case int64:
			b = binary.BigEndian.AppendUint64(b, uint64(v))
		case int32:
			b = binary.BigEndian.AppendUint32(b, uint32(v))
		case float64:
			b = binary.BigEndian.AppendUint64(b, math.Float64bits(v))
		case bool:
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	}
	t.buf = b
	return string(b)
}

// PreCommit writes the rows and the epoch's audit row in one transaction
// and prepares it under id. BEGIN, the audit row and the rows go in one
// round trip (a pipeline), PREPARE TRANSACTION in a second: it takes no
// parameters, and as a one-off statement it must not enter the statement
// cache.
//
// Ordering rule: the audit row is written first, so a second attempt at an
// epoch already committed fails at once on its primary key
// (ErrSinkConflict), and one at an epoch another transaction holds
// prepared waits for that one's lock (bounded by Config.LockTimeout).
func (t *epochTxn) PreCommit(ctx context.Context, id txsink.TxnID) error {
	s := t.s
	pool, err := s.connPool()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("pgsink: task %d epoch %d: connect: %w", id.Task, id.Epoch, err)
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("INSERT INTO "+s.audit+` (app, task, epoch, txn, "table", rows) VALUES ($1, $2, $3, $4, $5, $6)`,
		s.cfg.App, id.Task, int64(id.Epoch), id.String(), s.cfg.Table, int64(len(t.rows)))
	for from := 0; from < len(t.rows); from += chunkRows {
		b.Queue(s.write, t.columnArrays(t.rows[from:min(from+chunkRows, len(t.rows))])...)
	}
	err = conn.SendBatch(ctx, b).Close()
	if err == nil {
		_, err = conn.Exec(ctx, "PREPARE TRANSACTION "+quote(id.String()))
	}
	if err == nil {
		return nil
	}
	if !conn.Conn().IsClosed() {
		// The server rolled back a PREPARE that failed; anything else
		// left the transaction open, failed.
		if _, rerr := conn.Exec(context.Background(), "ROLLBACK"); rerr != nil {
			conn.Conn().Close(context.Background())
		}
	}
	return t.classify(id, err)
}

// classify wraps the errors that stop the instance: the audit row's
// primary key taken (the epoch is applied already), or a row the server
// refuses for good (data exceptions, constraints: SQLSTATE classes 22 and
// 23). Anything else (the server down, a lock timeout) fails the epoch,
// which is tried again.
func (t *epochTxn) classify(id txsink.TxnID, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "23505" && pe.TableName == AuditTable:
			return fmt.Errorf("%w: task %d epoch %d is already in %s (another app with id %q writing to this database?): %w",
				txsink.ErrSinkConflict, id.Task, id.Epoch, AuditTable, t.s.cfg.App, err)
		case strings.HasPrefix(pe.Code, "22"), strings.HasPrefix(pe.Code, "23"):
			return fmt.Errorf("%w: task %d epoch %d: %w", txsink.ErrSinkRefused, id.Task, id.Epoch, err)
		}
	}
	return fmt.Errorf("pgsink: task %d epoch %d: pre-commit: %w", id.Task, id.Epoch, err)
}

// writeStatement inserts a batch of rows given as one array per column;
// in upsert mode a row whose key exists replaces it.
func (s *Sink) writeStatement() string {
	names := make([]string, len(s.cfg.Columns))
	arrays := make([]string, len(s.cfg.Columns))
	var set []string
	for i, c := range s.cfg.Columns {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
		arrays[i] = fmt.Sprintf("$%d::%s[]", i+1, c.Type)
		if s.keyIdx != nil && !containsInt(s.keyIdx, i) {
			set = append(set, names[i]+" = EXCLUDED."+names[i])
		}
	}
	q := "INSERT INTO " + s.table + " (" + strings.Join(names, ", ") + ") SELECT * FROM unnest(" + strings.Join(arrays, ", ") + ")"
	switch {
	case s.keyIdx == nil:
	case len(set) == 0:
		q += " ON CONFLICT (" + s.quotedList(s.cfg.Key) + ") DO NOTHING"
	default:
		q += " ON CONFLICT (" + s.quotedList(s.cfg.Key) + ") DO UPDATE SET " + strings.Join(set, ", ")
	}
	return q
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// columnArrays turns rows into one array per column, NULLs as nil
// pointers.
func (t *epochTxn) columnArrays(rows [][]any) []any {
	out := make([]any, len(t.s.cfg.Columns))
	for i, c := range t.s.cfg.Columns {
		switch c.Type {
		case Text:
			out[i] = column[string](rows, i)
		case BigInt:
			out[i] = column[int64](rows, i)
		case Integer:
			out[i] = column[int32](rows, i)
		case Double:
			out[i] = column[float64](rows, i)
		case Boolean:
			out[i] = column[bool](rows, i)
		case Bytea:
			a := make([][]byte, len(rows))
			for r, row := range rows {
				if v, ok := row[i].([]byte); ok {
					a[r] = v
				}
			}
			out[i] = a
		}
	}
	return out
}

func column[T any](rows [][]any, i int) []*T {
	vals := make([]T, len(rows))
	a := make([]*T, len(rows))
	for r, row := range rows {
		if v, ok := row[i].(T); ok {
			vals[r] = v
			a[r] = &vals[r]
		}
	}
	return a
}

// quote is a SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
