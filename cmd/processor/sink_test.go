package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/pgtest"
)

// The binary with SLUICE_SINK=postgres and no output topic: aggregate
// upserts one row per key into a table it creates; after a kill -9 and a
// restart the table equals a recomputation from the input. The URL's
// password never reaches the log.
func TestProcessorSinkPostgres(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	srv := pgtest.Start(t)
	u, _ := url.Parse(srv.Database(t, "e2e"))
	u.User = url.UserPassword("postgres", "hunter2") // trust: ignored by the server, but a secret to the processor
	p := newProc(t, brokers, "a")
	p.env = append(p.env, "SLUICE_OUTPUT_TOPIC=", "SLUICE_SINK=postgres", "SLUICE_POSTGRES_URL="+u.String(), "SLUICE_POSTGRES_TABLE=public.aggregates")
	p.start()
	p.awaitReady()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	want := map[string][4]int64{}
	n := 0
	send := func(count int) {
		var recs []*kgo.Record
		for range count {
			n++
			key := "k" + strconv.Itoa(n%37)
			a, ok := want[key]
			if !ok {
				a = [4]int64{0, 0, int64(n), int64(n)}
			}
			a = [4]int64{a[0] + 1, a[1] + int64(n), min(a[2], int64(n)), max(a[3], int64(n))}
			want[key] = a
			recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(strconv.Itoa(n))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	awaitTable := func() {
		t.Helper()
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		deadline := time.Now().Add(30 * time.Second)
		for {
			rows, err := conn.Query(ctx, "SELECT key, count, sum, min, max FROM aggregates")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][4]int64{}
			for rows.Next() {
				var k string
				var a [4]int64
				if err := rows.Scan(&k, &a[0], &a[1], &a[2], &a[3]); err != nil {
					t.Fatal(err)
				}
				got[k] = a
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("table after %d inputs: %d keys, want %d; log:\n%s", n, len(got), len(want), p.log.String())
			}
			<-time.After(50 * time.Millisecond) // polling a condition, with a deadline
		}
	}
	send(1000)
	awaitTable()
	if err := p.stop(syscall.SIGKILL); err == nil {
		t.Fatal("kill -9 reported a clean exit")
	}
	send(1000)
	p.start()
	send(1000)
	awaitTable()
	if err := p.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if strings.Contains(p.log.String(), "hunter2") {
		t.Fatal("the log shows the database password")
	}
}

// A table of another shape stops the processor at start (status 1) with a
// line naming the table.
func TestProcessorSinkRefusesTableOfAnotherShape(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE aggregates (key text PRIMARY KEY, total numeric)"); err != nil {
		t.Fatal(err)
	}
	p := newProc(t, c.ListenAddrs()[0], "a")
	p.env = append(p.env, "SLUICE_OUTPUT_TOPIC=", "SLUICE_SINK=postgres", "SLUICE_POSTGRES_URL="+srv.URL(), "SLUICE_POSTGRES_TABLE=aggregates")
	p.start()
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("still running; log:\n%s", p.log.String())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(p.log.String(), "table aggregates exists with columns (key text, total numeric)") {
		t.Fatalf("exit %d; log:\n%s", code, p.log.String())
	}
}

// With the database unreachable at start the processor waits for it like
// for the brokers: alive, not ready, retrying, and it stops cleanly.
func TestProcessorSinkWaitsForTheDatabase(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := newProc(t, c.ListenAddrs()[0], "a")
	dead := freeAddr(t) // nothing listens there once freeAddr returns
	p.env = append(p.env, "SLUICE_SINK=postgres", "SLUICE_POSTGRES_URL=postgres://sluice@"+dead+"/db?sslmode=disable&connect_timeout=2", "SLUICE_POSTGRES_TABLE=aggregates")
	p.start()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(p.log.String(), "sink not reachable yet") {
		if time.Now().After(deadline) {
			t.Fatalf("log does not mention waiting for the database:\n%s", p.log.String())
		}
		<-time.After(50 * time.Millisecond)
	}
	if code, _ := p.get("/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	if code, _ := p.get("/readyz"); code != 503 {
		t.Fatalf("/readyz with the database down: %d, want 503", code)
	}
	if err := p.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM with the database down: %v", err)
	}
}
