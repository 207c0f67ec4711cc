package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The server starts, answers, allows prepared transactions, and comes
// back after a stop with what it held.
func TestServer(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT current_setting('max_prepared_transactions')::int").Scan(&n); err != nil || n != MaxPreparedTransactions {
		t.Fatalf("max_prepared_transactions = %d, %v", n, err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v int)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	s.Stop(t)
	if _, err := pgx.Connect(ctx, s.URL()); err == nil {
		t.Fatal("connected to a stopped server")
	}
	s.Restart(t)
	conn, err = pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
}
