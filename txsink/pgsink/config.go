package pgsink

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Type is a column's PostgreSQL type, as format_type names it.
type Type string

// The column types a sink writes, and the Go values a row gives for them
// (nil is NULL, refused in a key column).
const (
	Text    Type = "text"             // string, valid UTF-8 without NUL
	Bytea   Type = "bytea"            // []byte
	BigInt  Type = "bigint"           // int64, int, int32
	Integer Type = "integer"          // int32, or an int or int64 in its range
	Double  Type = "double precision" // float64
	Boolean Type = "boolean"          // bool
)

// Column is one column of the table.
type Column struct {
	Name string
	Type Type
}

// Config configures a sink.
type Config struct {
	// URL is the connection string (postgres://… or key=value). It may
	// hold a password: it is never logged.
	URL string
	// App is the app id: the audit table's app column and the prefix of
	// the prepared transactions' ids.
	App string
	// Table is the table the rows go to, optionally schema-qualified
	// (schema.table). It is created if missing; one of another shape is
	// refused.
	Table string
	// Columns are the table's columns in order; a row gives one value per
	// column.
	Columns []Column
	// Key names the primary key columns for upserts; empty means every row
	// is inserted.
	Key []string
	// MaxConns bounds the connections (tasks pre-commit in parallel).
	// Default 8.
	MaxConns int32
	// LockTimeout bounds how long a write waits for a row lock, such as
	// one a stray prepared transaction holds (it is rolled back by the
	// next claim of the task: see txsink.EpochSink). Default 10s.
	LockTimeout time.Duration
	// Logger receives the sink's logs. Default slog.Default().
	Logger *slog.Logger
}

func (c *Config) fill() error {
	if c.MaxConns <= 0 {
		c.MaxConns = 8
	}
	if c.LockTimeout <= 0 {
		c.LockTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.URL == "":
		return errors.New("pgsink: Config.URL is empty")
	case c.App == "":
		return errors.New("pgsink: Config.App is empty")
	case c.Table == "":
		return errors.New("pgsink: Config.Table is empty")
	case len(c.Columns) == 0:
		return errors.New("pgsink: Config.Columns is empty")
	case len(strings.Split(c.Table, ".")) > 2:
		return fmt.Errorf("pgsink: Config.Table %q: want table or schema.table", c.Table)
	}
	seen := map[string]bool{}
	for _, col := range c.Columns {
		switch col.Type {
		case Text, Bytea, BigInt, Integer, Double, Boolean:
		default:
			return fmt.Errorf("pgsink: column %q: type %q is not one of text, bytea, bigint, integer, double precision, boolean", col.Name, col.Type)
		}
		if col.Name == "" || seen[col.Name] {
			return fmt.Errorf("pgsink: column name %q is empty or repeated", col.Name)
		}
		seen[col.Name] = true
	}
	for _, k := range c.Key {
		if !seen[k] {
			return fmt.Errorf("pgsink: key column %q is not among the columns", k)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(c.Key)))) != len(c.Key) {
		return fmt.Errorf("pgsink: key columns %v repeat", c.Key)
	}
	return nil
}

// Named pairs column names with their types, in order.
func Named(names []string, types ...Type) []Column {
	cols := make([]Column, len(names))
	for i, n := range names {
		cols[i] = Column{Name: n, Type: types[i]}
	}
	return cols
}
