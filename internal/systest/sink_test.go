package systest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/txsink"
	"github.com/sluicehq/sluice/txsink/pgsink"
)

// sinkTable is where the test instances' rows go (DESIGN §7's columns).
const sinkTable = "results"

// withSink makes cfg's job write its results to PostgreSQL at url as
// well: aggregate upserts a row per key, echo inserts a row per record.
func withSink(cfg *sluice.Options, url, job string) error {
	pc := pgsink.Config{URL: url, App: cfg.AppID, Table: sinkTable, Logger: cfg.Logger}
	switch job {
	case "echo":
		cfg.Job = jobs.EchoWith(jobs.EchoOptions{Emit: true, Rows: true})
		pc.Columns = pgsink.Named(jobs.EchoColumns, pgsink.Text, pgsink.Integer, pgsink.BigInt, pgsink.Bytea, pgsink.Bytea)
	default:
		cfg.Job = jobs.AggregateWith(jobs.AggregateOptions{Emit: true, Rows: true})
		pc.Columns = pgsink.Named(jobs.AggregateColumns, pgsink.Text, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt, pgsink.BigInt)
		pc.Key = []string{"key"}
	}
	s, err := pgsink.New(pc)
	if err != nil {
		return err
	}
	cfg.Sink = s
	return nil
}

// expectedTable recomputes the aggregate table from the input: key →
// "count sum min max".
func (f *feeder) expectedTable() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for k, vs := range f.values {
		a := check.Running(vs)[len(vs)-1]
		out[k] = fmt.Sprint(a.Count, a.Sum, a.Min, a.Max)
	}
	return out
}

// expectedRows is the echo table expected from the input: per partition,
// "key=value" in offset order.
func (f *feeder) expectedRows() map[int32][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int32][]string{}
	for p, vs := range f.raw {
		for _, v := range vs {
			out[p] = append(out[p], string(v))
		}
	}
	return out
}

// preparedHere lists the prepared transactions of the connection's
// database: pg_prepared_xacts spans the whole server, which the parallel
// subtests of one test share (each with a database of its own).
const preparedHere = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"

func query[T any](t *testing.T, url, sql string, scan pgx.RowToFunc[T]) []T {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func aggregateTable(t *testing.T, url string) map[string]string {
	type row struct {
		k string
		v string
	}
	rows := query(t, url, "SELECT key, format('%s %s %s %s', count, sum, min, max) FROM "+sinkTable, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.k, &x.v)
	})
	out := map[string]string{}
	for _, r := range rows {
		out[r.k] = r.v
	}
	return out
}

func echoTable(t *testing.T, url string) map[int32][]string {
	type row struct {
		p  int32
		kv string
	}
	rows := query(t, url, `SELECT partition, convert_from(key, 'UTF8') || '=' || convert_from(value, 'UTF8') FROM `+sinkTable+` ORDER BY partition, "offset"`,
		func(r pgx.CollectableRow) (row, error) {
			var x row
			return x, r.Scan(&x.p, &x.kv)
		})
	out := map[int32][]string{}
	for _, r := range rows {
		out[r.p] = append(out[r.p], r.kv)
	}
	return out
}

// awaitTable waits until the table equals what the input says (the last
// epoch's COMMIT PREPARED follows its Kafka commit, so the table may trail
// the output a moment), then checks the audit table against the changelog.
func awaitTable(t *testing.T, url, brokers, app, job string, f *feeder) {
	t.Helper()
	equal := func() (bool, string) {
		if job == "echo" {
			got, want := echoTable(t, url), f.expectedRows()
			return maps.EqualFunc(got, want, slices.Equal), fmt.Sprintf("%d partitions, want %d", len(got), len(want))
		}
		got, want := aggregateTable(t, url), f.expectedTable()
		diff := 0
		for k, v := range want {
			if got[k] != v {
				diff++
			}
		}
		return maps.Equal(got, want), fmt.Sprintf("%d keys, want %d; %d differ", len(got), len(want), diff)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := equal()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("table %s does not match the input: %s", sinkTable, why)
		}
		<-time.After(100 * time.Millisecond) // polling a condition, with a deadline
	}
	checkAudit(t, url, brokers, app)
}

// checkAudit compares the audit table with the changelog: every committed
// epoch marker that names a sink transaction has its audit row with that
// transaction, and there is no other (so no epoch is applied twice, none
// that Kafka aborted is applied, none that it committed is missing).
// Nothing of the app is left prepared.
func checkAudit(t *testing.T, url, brokers, app string) {
	t.Helper()
	audit := query(t, url, "SELECT txn FROM "+pgsink.AuditTable+" WHERE app = '"+app+"'", pgx.RowTo[string])
	// The markers that name a sink transaction, of records read so far.
	markers := func(recs []*kgo.Record) map[string]bool {
		want := map[string]bool{}
		for _, r := range recs {
			if !changelog.IsMarker(r.Key) {
				continue
			}
			m, err := changelog.DecodeMarker(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			if m.SinkTxn != "" {
				want[m.SinkTxn] = true
			}
		}
		return want
	}
	// Read until every audited transaction's marker is found, not only
	// until the reader has been idle a while: on a busy machine a 2 s
	// idle ended the read half way, and the audit rows of the markers not
	// read looked applied without Kafka (seen once in make test). An
	// audited transaction with no marker is found by the idle bound.
	read := func(idle time.Duration, done func([]*kgo.Record) bool) map[string]bool {
		recs, err := check.ReadCommitted(context.Background(), []string{brokers}, changelog.TopicName(app), idle, done)
		if err != nil {
			t.Fatal(err)
		}
		return markers(recs)
	}
	want := read(awaitIdle, func(recs []*kgo.Record) bool {
		m := markers(recs)
		for _, txn := range audit {
			if !m[txn] {
				return false
			}
		}
		return len(audit) > 0
	})
	// Then the whole changelog, for markers past those (an epoch whose
	// audit row is missing).
	maps.Copy(want, read(2*time.Second, nil))
	got := map[string]bool{}
	for _, txn := range audit {
		got[txn] = true
	}
	if len(want) == 0 || !maps.Equal(got, want) {
		missing, extra := 0, 0
		for k := range want {
			if !got[k] {
				missing++
			}
		}
		for k := range got {
			if !want[k] {
				extra++
			}
		}
		t.Fatalf("audit table: %d epochs, changelog markers name %d: %d missing, %d not committed in Kafka", len(got), len(want), missing, extra)
	}
	prepared := query(t, url, preparedHere+" AND gid LIKE 'sluice/"+app+"/%'", pgx.RowTo[string])
	if len(prepared) > 0 {
		t.Fatalf("left prepared: %v", prepared)
	}
	t.Logf("audit: %d epochs applied once each", len(got))
}

// TestSinkCrashPoints kills a real instance process writing to PostgreSQL
// at each step of the sink's protocol (docs/sinks.md's crash table); after
// a restart the table equals a replay of the input, the audit table holds
// each committed epoch once, and nothing is left prepared.
//
//	crash point                         after restart
//	before the epoch ends               Kafka aborts (fenced); nothing prepared
//	sink prepared, Kafka not committed  Kafka aborts; Recover rolls the prepared transaction back
//	Kafka committed, sink not           Recover commits the prepared transaction: the epoch's rows, once
//
// The pipelined cases process each epoch while the one before commits
// (Options.PipelinedEpochs), and crash only once records were processed
// during a commit: the crash may take a sealed epoch's prepared rows with
// it, and the next epoch's, which were never written.
func TestSinkCrashPoints(t *testing.T) {
	srv := pgtest.Start(t)
	tests := []struct {
		name, point, job string
		pipelined        bool
	}{
		{"before the epoch ends", sluice.PointBeforePreCommit, "aggregate", false},
		{"sink prepared, Kafka not", sluice.PointBeforeCommit, "aggregate", false},
		{"Kafka committed, sink not", sluice.PointAfterCommit, "aggregate", false},
		{"echo: Kafka committed, sink not", sluice.PointAfterCommit, "echo", false},
		{"pipelined: sink prepared, Kafka not", sluice.PointBeforeCommit, "aggregate", true},
		{"pipelined echo: Kafka committed, sink not", sluice.PointAfterCommit, "echo", true},
	}
	for i, tt := range tests {
		url := srv.Database(t, "crash"+strconv.Itoa(i))
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kc := newKfake(t, 3)
			brokers := kc.ListenAddrs()[0]
			f := newFeeder(t, brokers, 40, uint64(60+i))
			app := "sinkcrash"
			c := newChild(t, brokers, app, "i1", t.TempDir(), tt.job, sluice.ExactlyOnce, "SYSTEST_PG_URL="+url, fmt.Sprintf("SYSTEST_PIPELINED=%v", tt.pipelined))
			crash := []string{"SYSTEST_CRASH_AT=" + tt.point, "SYSTEST_CRASH_AFTER=3"}
			release := func() {}
			if tt.pipelined {
				// The crash comes at the point of the first epoch that
				// committed while the next one's records were processed:
				// held at the broker after three epochs, if no overlap
				// came by itself before.
				release = holdForOverlap(t, kc, 3)
				crash = []string{"SYSTEST_CRASH_AT=" + tt.point, "SYSTEST_CRASH_AFTER=0", "SYSTEST_CRASH_WHEN=sluice_overlapped_records_total>=1"}
			}
			c.start(crash...)
			deadline := time.Now().Add(60 * time.Second)
			for c.running() {
				if time.Now().After(deadline) {
					c.dumpStuck()
					t.Fatalf("instance did not reach %s", tt.point)
				}
				f.produce(50, 0)
				c.wait(100 * time.Millisecond)
			}
			release()
			if !c.crashed() {
				c.dumpLog()
				t.Fatal("the instance exited without crashing")
			}
			if tt.point != sluice.PointBeforePreCommit {
				// The crash left a prepared transaction behind.
				if n := len(query(t, url, preparedHere, pgx.RowTo[string])); n == 0 {
					t.Fatalf("nothing prepared after a crash at %s", tt.point)
				}
			}
			c.start()
			f.produce(300, 0)
			var rep check.Report
			if tt.job == "echo" {
				rep = awaitEcho(t, brokers, f, awaitIdle)
			} else {
				rep = awaitAggregate(t, brokers, f, awaitIdle)
			}
			if !rep.OK() {
				c.dumpLog()
				t.Fatalf("output after crash %s: %v", tt.name, rep)
			}
			awaitTable(t, url, brokers, app, tt.job, f)
		})
	}
}

// TestSinkDatabaseDown stops PostgreSQL while an instance writes to it:
// the instance stops being ready and its restores wait on the database;
// once it is back, nothing is lost or doubled, in the table or the output.
// With pipelined epochs too, whose pre-commit runs beside the next epoch.
func TestSinkDatabaseDown(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelined=%v", pipelined), func(t *testing.T) {
			t.Parallel()
			sinkDatabaseDown(t, pipelined)
		})
	}
}

func sinkDatabaseDown(t *testing.T, pipelined bool) {
	srv := pgtest.Start(t)
	brokers := newCluster(t, 4)
	f := newFeeder(t, brokers, 50, 71)
	cfg := options(brokers, "sinkdown", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	cfg.PipelinedEpochs = pipelined
	if err := withSink(&cfg, srv.URL(), "aggregate"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cfg.Sink.Close)
	p := startInProcess(t, cfg)
	p.awaitReady(t)
	f.produce(500, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("before the database stops: %v", rep)
	}
	awaitTable(t, srv.URL(), brokers, "sinkdown", "aggregate", f)

	srv.Stop(t)
	f.produce(200, 0)
	deadline := time.Now().Add(60 * time.Second)
	for p.inst.Ready() || restoring(t, cfg) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the instance stayed ready (or no task waited in its restore) with the database down")
		}
		<-time.After(20 * time.Millisecond)
	}
	f.produce(200, 0)
	srv.Restart(t)
	p.awaitReady(t)
	f.produce(100, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("after the database came back: %v", rep)
	}
	awaitTable(t, srv.URL(), brokers, "sinkdown", "aggregate", f)
	if n, err := check.MetricSum(cfg.Registry.(*prometheus.Registry), "sluice_sink_transactions_total"); err != nil || n == 0 {
		t.Fatalf("sluice_sink_transactions_total = %v, %v", n, err)
	}
}

// restoring is the number of the instance's tasks restoring
// (sluice_tasks{state="restoring"}).
func restoring(t *testing.T, cfg sluice.Options) float64 {
	t.Helper()
	n, err := check.MetricSum(cfg.Registry.(*prometheus.Registry), "sluice_tasks", "state", "restoring")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A row WriteRow refuses (a key that is not valid UTF-8 for a text
// column) fails its record, which goes to the dead-letter topic with
// nothing of it in the table or the output; a row the database refuses at
// pre-commit (a CHECK constraint WriteRow cannot know) stops the instance
// with txsink.ErrSinkRefused instead of failing every epoch, and nothing of
// that epoch is in the table.
func TestSinkRefusals(t *testing.T) {
	srv := pgtest.Start(t)
	brokers := newCluster(t, 2)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE "+sinkTable+" (key text PRIMARY KEY, count bigint, sum bigint, min bigint, max bigint, CHECK (sum < 1000000))"); err != nil {
		t.Fatal(err)
	}
	cfg := options(brokers, "refuse", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	cfg.Checkpoint.TolerableFailures = 10 // it must stop on the refusal, not on a count of failures
	if err := withSink(&cfg, srv.URL(), "aggregate"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cfg.Sink.Close)
	inst, err := sluice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(key, value string) {
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: input, Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce("good", "1")
	produce("bad\xff", "2")
	dlq, err := check.ReadCommitted(ctx, []string{brokers}, "refuse-dlq", 30*time.Second, check.Settled(1))
	if err != nil || len(dlq) != 1 || string(dlq[0].Key) != "bad\xff" {
		t.Fatalf("dead letters: %v, %v", dlq, err)
	}
	if out, err := check.ReadCommitted(ctx, []string{brokers}, output, 30*time.Second, check.Settled(1)); err != nil || len(out) != 1 || string(out[0].Key) != "good" {
		t.Fatalf("output: %v, %v", out, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for aggregateTable(t, srv.URL())["good"] != "1 1 1 1" {
		if time.Now().After(deadline) {
			t.Fatalf("table: %v", aggregateTable(t, srv.URL()))
		}
		<-time.After(50 * time.Millisecond)
	}
	produce("big", "2000000")
	select {
	case err := <-done:
		if !errors.Is(err, txsink.ErrSinkRefused) {
			t.Fatalf("Run: %v, want ErrSinkRefused", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the instance kept running after the database refused a row")
	}
	if got := aggregateTable(t, srv.URL()); len(got) != 1 {
		t.Fatalf("table after the refusal: %v", got)
	}
	if n := len(query(t, srv.URL(), preparedHere, pgx.RowTo[string])); n != 0 {
		t.Fatalf("%d left prepared", n)
	}
}
