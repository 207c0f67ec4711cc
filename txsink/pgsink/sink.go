package pgsink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/txsink"
)

// AuditTable is the audit table's name, in the schema of the sink's table.
const AuditTable = "sluice_sink_epochs"

// Sink writes epochs into one table. Its methods may be called from any
// goroutine.
type Sink struct {
	cfg    Config
	table  string // quoted, possibly schema-qualified
	audit  string // quoted, in the table's schema
	keyIdx []int  // positions of the key columns in a row; nil: insert mode
	write  string // the statement writing a batch of rows

	mu   sync.Mutex
	pool *pgxpool.Pool // nil until Setup succeeded
}

var _ txsink.EpochSink = (*Sink)(nil)

// New builds a sink; nothing touches the network until Setup.
func New(cfg Config) (*Sink, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	parts := strings.Split(cfg.Table, ".")
	s := &Sink{cfg: cfg, table: pgx.Identifier(parts).Sanitize()}
	auditName := pgx.Identifier{AuditTable}
	if len(parts) == 2 {
		auditName = pgx.Identifier{parts[0], AuditTable}
	}
	s.audit = auditName.Sanitize()
	for _, k := range cfg.Key {
		s.keyIdx = append(s.keyIdx, slices.IndexFunc(cfg.Columns, func(c Column) bool { return c.Name == k }))
	}
	s.write = s.writeStatement()
	return s, nil
}

// Setup connects, checks that the server allows prepared transactions,
// and creates the table and the audit table if missing; a table of another
// shape is refused.
func (s *Sink) Setup(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool != nil {
		return nil
	}
	pc, err := pgxpool.ParseConfig(s.cfg.URL)
	if err != nil {
		// The parser's message can quote the URL, password and all.
		return fmt.Errorf("%w: SLUICE_POSTGRES_URL does not parse as a PostgreSQL connection string", txsink.ErrSinkSetup)
	}
	pc.MaxConns = s.cfg.MaxConns
	pc.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(s.cfg.LockTimeout.Milliseconds(), 10)
	pc.ConnConfig.RuntimeParams["application_name"] = "sluice " + s.cfg.App
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("pgsink: connect: %w", err)
	}
	if err := s.setup(ctx, pool); err != nil {
		pool.Close()
		return err
	}
	s.pool = pool
	return nil
}

func (s *Sink) setup(ctx context.Context, pool *pgxpool.Pool) error {
	var maxPrepared int
	if err := pool.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&maxPrepared); err != nil {
		return fmt.Errorf("pgsink: read max_prepared_transactions: %w", err)
	}
	if maxPrepared == 0 {
		return fmt.Errorf("%w: the PostgreSQL server has max_prepared_transactions = 0, so it refuses PREPARE TRANSACTION, which the sink needs: "+
			"set it to at least the number of input partitions of every app writing to this server "+
			"(ALTER SYSTEM SET max_prepared_transactions = 64, or max_prepared_transactions = 64 in postgresql.conf) and restart the server", txsink.ErrSinkSetup)
	}
	cols := make([]string, len(s.cfg.Columns))
	for i, c := range s.cfg.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize() + " " + string(c.Type)
		if slices.Contains(s.cfg.Key, c.Name) {
			cols[i] += " NOT NULL"
		}
	}
	if len(s.cfg.Key) > 0 {
		cols = append(cols, "PRIMARY KEY ("+s.quotedList(s.cfg.Key)+")")
	}
	// Concurrent instances may race to create the same table: CREATE
	// TABLE IF NOT EXISTS can still fail on the catalog's unique index,
	// which is only a sign that the other one won.
	for _, ddl := range []string{
		"CREATE TABLE IF NOT EXISTS " + s.table + " (" + strings.Join(cols, ", ") + ")",
		"CREATE TABLE IF NOT EXISTS " + s.audit + ` (app text NOT NULL, task integer NOT NULL, epoch bigint NOT NULL,
			txn text NOT NULL, "table" text NOT NULL, rows bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT now(),
			PRIMARY KEY (app, task, epoch))`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil && !isCode(err, "23505") {
			return fmt.Errorf("pgsink: create table: %w", err)
		}
	}
	return s.checkShape(ctx, pool)
}

// checkShape refuses a table whose columns, types or primary key are not
// the configured ones: rows written into it would not mean what the job
// meant.
func (s *Sink) checkShape(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod),
			coalesce(a.attnum = ANY(i.indkey), false)
		FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, s.table)
	if err != nil {
		return fmt.Errorf("pgsink: read the shape of %s: %w", s.cfg.Table, err)
	}
	var have []string
	var key []string
	for rows.Next() {
		var name, typ string
		var pk bool
		if err := rows.Scan(&name, &typ, &pk); err != nil {
			return err
		}
		have = append(have, name+" "+typ)
		if pk {
			key = append(key, name)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgsink: read the shape of %s: %w", s.cfg.Table, err)
	}
	want := make([]string, len(s.cfg.Columns))
	for i, c := range s.cfg.Columns {
		want[i] = c.Name + " " + string(c.Type)
	}
	wantKey := slices.Sorted(slices.Values(s.cfg.Key))
	slices.Sort(key)
	if !slices.Equal(have, want) || !slices.Equal(key, wantKey) {
		return fmt.Errorf("%w: table %s exists with columns (%s) and primary key (%s); the job writes columns (%s) with primary key (%s): drop or rename the table, or set SLUICE_POSTGRES_TABLE to another",
			txsink.ErrSinkSetup, s.cfg.Table, strings.Join(have, ", "), strings.Join(key, ", "), strings.Join(want, ", "), strings.Join(wantKey, ", "))
	}
	return nil
}

// Close closes the sink's connections.
func (s *Sink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool != nil {
		s.pool.Close()
		s.pool = nil
	}
}

func (s *Sink) connPool() (*pgxpool.Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool == nil {
		return nil, errors.New("pgsink: not set up")
	}
	return s.pool, nil
}

func (s *Sink) quotedList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgx.Identifier{n}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// Check validates a row against the columns: arity, NULL in a key column,
// Go types, and text PostgreSQL would refuse (invalid UTF-8, NUL).
func (s *Sink) Check(row []any) error {
	if len(row) != len(s.cfg.Columns) {
		return fmt.Errorf("pgsink: row has %d values, table %s has %d columns", len(row), s.cfg.Table, len(s.cfg.Columns))
	}
	for i, v := range row {
		c := s.cfg.Columns[i]
		if isNull(v) {
			if slices.Contains(s.keyIdx, i) {
				return fmt.Errorf("pgsink: key column %q is NULL", c.Name)
			}
			continue
		}
		if _, err := normalize(c, v); err != nil {
			return err
		}
	}
	return nil
}

// isNull reports whether v is written as NULL: nil, or a nil []byte (a
// Kafka record's null key).
func isNull(v any) bool {
	if v == nil {
		return true
	}
	b, ok := v.([]byte)
	return ok && b == nil
}

// normalize returns v as the Go type its column's writer takes.
func normalize(c Column, v any) (any, error) {
	bad := func() (any, error) {
		return nil, fmt.Errorf("pgsink: column %q (%s): a %T cannot be written to it", c.Name, c.Type, v)
	}
	switch c.Type {
	case Text:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		if !utf8.ValidString(s) {
			return nil, fmt.Errorf("pgsink: column %q: text is not valid UTF-8", c.Name)
		}
		if strings.IndexByte(s, 0) >= 0 {
			return nil, fmt.Errorf("pgsink: column %q: text holds a NUL byte, which PostgreSQL refuses", c.Name)
		}
		return s, nil
	case Bytea:
		b, ok := v.([]byte)
		if !ok {
			return bad()
		}
		return b, nil
	case BigInt:
		switch n := v.(type) {
		case int64:
			return n, nil
		case int:
			return int64(n), nil
		case int32:
			return int64(n), nil
		}
		return bad()
	case Integer:
		var n int64
		switch x := v.(type) {
		case int32:
			return x, nil
		case int:
			n = int64(x)
		case int64:
			n = x
		default:
			return bad()
		}
		if n < -1<<31 || n > 1<<31-1 {
			return nil, fmt.Errorf("pgsink: column %q: %d is out of range for integer", c.Name, n)
		}
		return int32(n), nil
	case Double:
		f, ok := v.(float64)
		if !ok {
			return bad()
		}
		return f, nil
	case Boolean:
		b, ok := v.(bool)
		if !ok {
			return bad()
		}
		return b, nil
	}
	return bad()
}

// since is for log lines: how long something took.
func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }
