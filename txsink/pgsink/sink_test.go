package pgsink

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/txsink"
)

var aggColumns = []Column{{"key", Text}, {"count", BigInt}, {"sum", BigInt}, {"min", BigInt}, {"max", BigInt}}

func aggConfig(url string) Config {
	return Config{URL: url, App: "app", Table: "totals", Columns: aggColumns, Key: []string{"key"}, LockTimeout: 300 * time.Millisecond}
}

func open(t testing.TB, cfg Config) *Sink {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Setup(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// table reads the aggregate table as key → "count sum min max".
func table(t testing.TB, c *pgx.Conn) map[string]string {
	t.Helper()
	rows, err := c.Query(context.Background(), "SELECT key, count, sum, min, max FROM totals")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var k string
		var n, s, lo, hi int64
		if err := rows.Scan(&k, &n, &s, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		out[k] = fmt.Sprint(n, s, lo, hi)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return out
}

func prepared(t testing.TB, c *pgx.Conn) []string {
	t.Helper()
	rows, err := c.Query(context.Background(), "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY gid")
	if err != nil {
		t.Fatal(err)
	}
	gids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return gids
}

func audit(t testing.TB, c *pgx.Conn) []string {
	t.Helper()
	rows, err := c.Query(context.Background(), "SELECT format('%s/%s/%s %s', app, task, epoch, rows) FROM sluice_sink_epochs ORDER BY app, task, epoch")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func id(task int32, epoch uint64, nonce string) txsink.TxnID {
	return txsink.TxnID{App: "app", Task: task, Epoch: epoch, Nonce: nonce}
}

func preCommit(t testing.TB, s *Sink, tid txsink.TxnID, rows ...[]any) error {
	t.Helper()
	txn := s.Begin(tid.Task)
	for _, r := range rows {
		if err := s.Check(r); err != nil {
			t.Fatal(err)
		}
		txn.Write(r)
	}
	return txn.PreCommit(context.Background(), tid)
}

func row(k string, n int64) []any { return []any{k, n, n, n, n} }

// Each step of the protocol: pre-commit is durable but not visible, commit
// makes it visible once (again is a no-op), abort throws it away (again is
// a no-op), and upserts of an epoch are merged per key.
func TestProtocolSteps(t *testing.T) {
	srv := pgtest.Start(t)
	s := open(t, aggConfig(srv.URL()))
	c := connect(t, srv.URL())
	ctx := context.Background()

	e1 := id(0, 1, "a")
	txn := s.Begin(0)
	for _, r := range [][]any{row("x", 1), row("y", 2), row("x", 3)} {
		txn.Write(r)
	}
	if txn.Len() != 2 {
		t.Fatalf("Len after two keys = %d", txn.Len())
	}
	if err := txn.PreCommit(ctx, e1); err != nil {
		t.Fatal(err)
	}
	if got := table(t, c); len(got) != 0 {
		t.Fatalf("prepared rows are visible: %v", got)
	}
	if got := prepared(t, c); !reflect.DeepEqual(got, []string{e1.String()}) {
		t.Fatalf("prepared = %v", got)
	}
	for range 2 {
		if err := s.Commit(ctx, e1); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := table(t, c), map[string]string{"x": "3 3 3 3", "y": "2 2 2 2"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after commit: %v, want %v", got, want)
	}

	e2 := id(0, 2, "b")
	if err := preCommit(t, s, e2, row("x", 9)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Abort(ctx, e2); err != nil {
			t.Fatal(err)
		}
	}
	if got := table(t, c); got["x"] != "3 3 3 3" {
		t.Fatalf("aborted epoch visible: %v", got)
	}
	// The aborted epoch is tried again under another nonce.
	e2b := id(0, 2, "c")
	if err := preCommit(t, s, e2b, row("x", 9)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, e2b); err != nil {
		t.Fatal(err)
	}
	if got := table(t, c); got["x"] != "9 9 9 9" {
		t.Fatalf("after epoch 2: %v", got)
	}
	if got, want := audit(t, c), []string{"app/0/1 2", "app/0/2 1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("audit = %v, want %v", got, want)
	}
	if got := prepared(t, c); len(got) != 0 {
		t.Fatalf("left prepared: %v", got)
	}
}

// Insert mode writes every row; NULLs (a record's null key) stay NULL.
func TestInsertMode(t *testing.T) {
	srv := pgtest.Start(t)
	cols := []Column{{"topic", Text}, {"partition", Integer}, {"offset", BigInt}, {"key", Bytea}, {"value", Bytea}}
	s := open(t, Config{URL: srv.URL(), App: "app", Table: "public.echo", Columns: cols})
	c := connect(t, srv.URL())
	ctx := context.Background()
	e := id(3, 1, "n")
	txn := s.Begin(3)
	for i := range 5 {
		r := []any{"in", 3, int64(i), []byte(nil), []byte("v")}
		if i > 0 {
			r[3] = []byte("k")
		}
		if err := s.Check(r); err != nil {
			t.Fatal(err)
		}
		txn.Write(r)
	}
	if err := txn.PreCommit(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, e); err != nil {
		t.Fatal(err)
	}
	var n, nulls int
	if err := c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE key IS NULL) FROM echo`).Scan(&n, &nulls); err != nil {
		t.Fatal(err)
	}
	if n != 5 || nulls != 1 {
		t.Fatalf("rows %d, null keys %d; want 5, 1", n, nulls)
	}
}

// Rows the sink could never write are refused at Check, before any I/O.
func TestCheck(t *testing.T) {
	s, err := New(aggConfig("postgres://unused"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		row  []any
		want string
	}{
		{"ok", row("k", 1), ""},
		{"int for bigint", []any{"k", 1, int32(2), int64(3), nil}, ""},
		{"arity", []any{"k", int64(1)}, "2 values"},
		{"null key", []any{nil, int64(1), int64(1), int64(1), int64(1)}, "NULL"},
		{"type", []any{"k", "1", int64(1), int64(1), int64(1)}, "a string cannot"},
		{"utf8", row("\xff", 1), "UTF-8"},
		{"nul", row("a\x00b", 1), "NUL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Check(tt.row)
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Check(%v) = %v, want %q", tt.row, err, tt.want)
			}
		})
	}
}

// A table of another shape, and a server without prepared transactions,
// are refused at Setup with ErrSinkSetup; a table of the right shape is
// taken as it is.
func TestSetupRefuses(t *testing.T) {
	srv := pgtest.Start(t)
	c := connect(t, srv.URL())
	ctx := context.Background()
	if _, err := c.Exec(ctx, "CREATE TABLE totals (key text PRIMARY KEY, count integer, sum bigint, min bigint, max bigint)"); err != nil {
		t.Fatal(err)
	}
	s, _ := New(aggConfig(srv.URL()))
	err := s.Setup(ctx)
	if !errors.Is(err, txsink.ErrSinkSetup) || !strings.Contains(err.Error(), "count integer") {
		t.Fatalf("Setup against a table of another shape: %v", err)
	}
	if _, err := c.Exec(ctx, "DROP TABLE totals; CREATE TABLE totals (key text, count bigint, sum bigint, min bigint, max bigint)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Setup(ctx); !errors.Is(err, txsink.ErrSinkSetup) || !strings.Contains(err.Error(), "primary key ()") {
		t.Fatalf("Setup against a table without its key: %v", err)
	}
	if _, err := c.Exec(ctx, "DROP TABLE totals; CREATE TABLE totals (key text PRIMARY KEY, count bigint, sum bigint, min bigint, max bigint)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Setup(ctx); err != nil {
		t.Fatalf("Setup against a table of the right shape: %v", err)
	}
	s.Close()

	no2pc := pgtest.Start(t, "max_prepared_transactions = 0")
	s, _ = New(aggConfig(no2pc.URL()))
	err = s.Setup(ctx)
	if !errors.Is(err, txsink.ErrSinkSetup) || !strings.Contains(err.Error(), "ALTER SYSTEM SET max_prepared_transactions") {
		t.Fatalf("Setup against max_prepared_transactions = 0: %v", err)
	}
	if strings.Contains(err.Error(), no2pc.URL()) {
		t.Fatalf("the error shows the URL: %v", err)
	}
}

// What stops the instance: an epoch already applied (ErrSinkConflict), a
// committed epoch whose prepared transaction is gone (ErrSinkConflict), a
// row the database refuses (ErrSinkRefused).
func TestConflictsAndRefusals(t *testing.T) {
	srv := pgtest.Start(t)
	s := open(t, aggConfig(srv.URL()))
	c := connect(t, srv.URL())
	ctx := context.Background()
	e1 := id(1, 1, "a")
	if err := preCommit(t, s, e1, row("x", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, e1); err != nil {
		t.Fatal(err)
	}
	if err := preCommit(t, s, id(1, 1, "b"), row("x", 2)); !errors.Is(err, txsink.ErrSinkConflict) {
		t.Fatalf("epoch applied twice: %v", err)
	}
	if err := s.Commit(ctx, id(1, 1, "b")); !errors.Is(err, txsink.ErrSinkConflict) {
		t.Fatalf("commit of another attempt of an applied epoch: %v", err)
	}
	if err := s.Commit(ctx, id(1, 2, "gone")); !errors.Is(err, txsink.ErrSinkConflict) {
		t.Fatalf("commit of a transaction never prepared: %v", err)
	}
	if _, err := c.Exec(ctx, "ALTER TABLE totals ADD CHECK (count >= 0)"); err != nil {
		t.Fatal(err)
	}
	if err := preCommit(t, s, id(1, 2, "c"), row("x", -1)); !errors.Is(err, txsink.ErrSinkRefused) {
		t.Fatalf("a row the database refuses: %v", err)
	}
	if got := prepared(t, c); len(got) != 0 {
		t.Fatalf("a failed pre-commit left %v prepared", got)
	}
	if got := table(t, c); got["x"] != "1 1 1 1" {
		t.Fatalf("table = %v", got)
	}
}

// Recover commits the last marker's transaction and rolls back every other
// one of the task prepared before the claim; one prepared after the claim
// (a newer owner's) is left alone, whatever a paused older owner's
// Recover says; other tasks' are never touched.
func TestRecover(t *testing.T) {
	srv := pgtest.Start(t)
	s := open(t, aggConfig(srv.URL()))
	c := connect(t, srv.URL())
	ctx := context.Background()

	committed, stray, otherTask := id(2, 5, "a"), id(2, 6, "b"), id(3, 6, "c")
	for _, e := range []txsink.TxnID{committed, stray, otherTask} {
		if err := preCommit(t, s, e, row(fmt.Sprintf("k%d%d", e.Task, e.Epoch), 1)); err != nil {
			t.Fatal(err)
		}
	}
	old, err := s.Claim(ctx, 2) // an owner that pauses before its Recover
	if err != nil {
		t.Fatal(err)
	}
	claim, err := s.Claim(ctx, 2) // the owner after it
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(ctx, claim, committed.String()); err != nil {
		t.Fatal(err)
	}
	if got, want := prepared(t, c), []string{otherTask.String()}; !reflect.DeepEqual(got, want) {
		t.Fatalf("prepared after Recover: %v, want %v", got, want)
	}
	if got := table(t, c); got["k25"] != "1 1 1 1" || len(got) != 1 {
		t.Fatalf("table after Recover: %v", got)
	}
	// The new owner's next epoch is prepared; Kafka commits it; the old
	// owner wakes up and recovers with what it restored.
	mine := id(2, 6, "d")
	if err := preCommit(t, s, mine, row("k26", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Recover(ctx, old, committed.String()); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, mine); err != nil {
		t.Fatalf("the new owner's epoch was rolled back by the old owner: %v", err)
	}
	if got := table(t, c); got["k26"] != "1 1 1 1" {
		t.Fatalf("table: %v", got)
	}
	// Recover of a marker whose transaction is neither prepared nor
	// applied: rows lost, which must not pass in silence.
	claim, _ = s.Claim(ctx, 2)
	if err := s.Recover(ctx, claim, id(2, 7, "never").String()); !errors.Is(err, txsink.ErrSinkConflict) {
		t.Fatalf("Recover of a lost transaction: %v", err)
	}
}

// A stray prepared transaction of the same epoch, prepared after the
// owner's claim (its Kafka transaction had already timed out), blocks the
// owner's pre-commit for LockTimeout: the epoch fails (an ordinary error,
// tried again), and the next claim's Recover rolls the stray back.
func TestStrayAfterClaim(t *testing.T) {
	srv := pgtest.Start(t)
	s := open(t, aggConfig(srv.URL()))
	ctx := context.Background()
	claim, _ := s.Claim(ctx, 0)
	if err := s.Recover(ctx, claim, ""); err != nil {
		t.Fatal(err)
	}
	if err := preCommit(t, s, id(0, 1, "zombie"), row("x", 1)); err != nil {
		t.Fatal(err)
	}
	err := preCommit(t, s, id(0, 1, "owner"), row("x", 2))
	if err == nil || errors.Is(err, txsink.ErrSinkConflict) || errors.Is(err, txsink.ErrSinkRefused) {
		t.Fatalf("pre-commit behind a stray: %v, want a retryable error", err)
	}
	claim, _ = s.Claim(ctx, 0)
	if err := s.Recover(ctx, claim, ""); err != nil {
		t.Fatal(err)
	}
	if err := preCommit(t, s, id(0, 1, "owner2"), row("x", 2)); err != nil {
		t.Fatal(err)
	}
}

// A process killed after PreCommit leaves its transaction prepared, and
// the restore's Recover commits it; one killed after Commit leaves it
// committed, and Recover changes nothing.
func TestKilledProcess(t *testing.T) {
	if os.Getenv("PGSINK_CHILD_URL") != "" {
		child()
		return
	}
	srv := pgtest.Start(t)
	s := open(t, aggConfig(srv.URL()))
	c := connect(t, srv.URL())
	ctx := context.Background()
	for i, step := range []string{"precommit", "commit"} {
		t.Run(step, func(t *testing.T) {
			e := id(int32(i), 1, "child")
			cmd := exec.Command(os.Args[0], "-test.run=^TestKilledProcess$")
			cmd.Env = append(os.Environ(), "PGSINK_CHILD_URL="+srv.URL(), "PGSINK_CHILD_STEP="+step, "PGSINK_CHILD_TXN="+e.String())
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(out)
			for sc.Scan() && sc.Text() != "done "+step {
			}
			cmd.Process.Kill()
			cmd.Wait()
			want := map[string]string{}
			if step == "commit" {
				want[e.String()] = "1 1 1 1"
			}
			if got := table(t, c); !reflect.DeepEqual(filter(got, e.String()), want) {
				t.Fatalf("after a kill -9 after %s: %v", step, got)
			}
			claim, err := s.Claim(ctx, e.Task)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Recover(ctx, claim, e.String()); err != nil {
				t.Fatal(err)
			}
			if got := table(t, c); got[e.String()] != "1 1 1 1" {
				t.Fatalf("after Recover: %v", got)
			}
			if got := prepared(t, c); len(got) != 0 {
				t.Fatalf("left prepared: %v", got)
			}
		})
	}
	if got := audit(t, c); len(got) != 2 {
		t.Fatalf("audit = %v", got)
	}
}

func filter(m map[string]string, k string) map[string]string {
	out := map[string]string{}
	if v, ok := m[k]; ok {
		out[k] = v
	}
	return out
}

// child pre-commits (and commits) one epoch whose only key is the
// transaction id, says so, and waits to be killed.
func child() {
	ctx := context.Background()
	s, err := New(aggConfig(os.Getenv("PGSINK_CHILD_URL")))
	if err == nil {
		err = s.Setup(ctx)
	}
	var e txsink.TxnID
	if err == nil {
		e, err = txsink.ParseTxnID(os.Getenv("PGSINK_CHILD_TXN"))
	}
	if err == nil {
		txn := s.Begin(e.Task)
		txn.Write(row(e.String(), 1))
		err = txn.PreCommit(ctx, e)
	}
	step := os.Getenv("PGSINK_CHILD_STEP")
	if err == nil && step == "commit" {
		err = s.Commit(ctx, e)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	fmt.Println("done " + step)
	select {}
}
