package sluice_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/testhook"
	"github.com/sluicehq/sluice/kstate"
)

var rates = kstate.Broadcast("rates", kstate.Int64())

// rateJob converts amounts with the rate its broadcast table holds for the
// currency (the record key), and reports each broadcast record each task
// applied as an output keyed "applied".
var rateJob = sluice.Job{
	Name: "rates", Emits: true, States: []string{rates.Name()},
	OnBroadcast: func(ctx sluice.Context, rec *sluice.Record) error {
		r, err := strconv.ParseInt(string(rec.Value), 10, 64)
		if err != nil {
			return err
		}
		if err := rates.Put(ctx, string(rec.Key), r); err != nil {
			return err
		}
		ctx.Emit([]byte("applied"), fmt.Appendf(nil, "%d:%d", ctx.Task(), rec.Offset))
		return nil
	},
	Process: func(ctx sluice.Context, rec *sluice.Record) error {
		r, ok, err := rates.Get(ctx, string(rec.Key))
		if err != nil || !ok {
			return fmt.Errorf("no rate for %s (%v)", rec.Key, err)
		}
		amount, err := strconv.ParseInt(string(rec.Value), 10, 64)
		if err != nil {
			return err
		}
		ctx.Emit(rec.Key, strconv.AppendInt(nil, amount*r, 10))
		return nil
	},
}

// Broadcast state: every task applies every broadcast record exactly once,
// across a crash and a restart (bbolt: from local state; memory: from the
// changelog), and Process reads the table its task applied; a write from
// Process is refused.
func TestBroadcastState(t *testing.T) {
	for _, backend := range []string{"bbolt", "memory"} {
		t.Run(backend, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "payments", "out"), kfake.SeedTopics(1, "rates"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			brokers := c.ListenAddrs()
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			produce := func(topic string, p int32, kv ...string) {
				t.Helper()
				var recs []*kgo.Record
				for i := 0; i < len(kv); i += 2 {
					recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(kv[i]), Value: []byte(kv[i+1])})
				}
				if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			state := t.TempDir()
			start := func() (*sluice.Instance, chan error) {
				inst, err := sluice.New(sluice.Options{Brokers: brokers, AppID: "bc", InstanceID: "i1", Job: rateJob,
					InputTopics: []string{"payments"}, OutputTopic: "out", BroadcastTopic: "rates", Backend: backend,
					StateDir: filepath.Join(state, "s"), SessionTimeout: 6 * time.Second,
					Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- inst.Run(context.Background()) }()
				return inst, done
			}
			outputs := func(n int) (applied []string, converted map[string]string) {
				t.Helper()
				recs, err := check.ReadCommitted(context.Background(), []string{brokers[0]}, "out", 30*time.Second,
					func(r []*kgo.Record) bool { return len(r) >= n })
				if err != nil || len(recs) < n {
					t.Fatalf("%d outputs of %d (%v)", len(recs), n, err)
				}
				converted = map[string]string{}
				for _, r := range recs {
					if string(r.Key) == "applied" {
						applied = append(applied, string(r.Value))
					} else {
						converted[string(r.Key)] += string(r.Value) + " "
					}
				}
				sort.Strings(applied)
				return applied, converted
			}

			inst, done := start()
			produce("rates", 0, "eur", "2", "usd", "3")
			applied, _ := outputs(4) // 2 records × 2 tasks
			if got := strings.Join(applied, " "); got != "0:0 0:1 1:0 1:1" {
				t.Fatalf("applied %s, want each of the 2 records once per task", got)
			}
			produce("payments", 0, "eur", "10")
			produce("payments", 1, "usd", "10")
			_, conv := outputs(6)
			if conv["eur"] != "20 " || conv["usd"] != "30 " {
				t.Fatalf("converted %v", conv)
			}
			testhook.Kill(inst) // a crash: no final checkpoint
			<-done

			inst, done = start()
			produce("rates", 0, "eur", "4")
			// Broadcast and input records are not ordered with each
			// other (as in Flink): the payment goes once the new rate
			// is applied.
			outputs(8)
			produce("payments", 0, "eur", "10")
			applied, conv = outputs(9)
			if got := strings.Join(applied, " "); got != "0:0 0:1 0:2 1:0 1:1 1:2" {
				t.Fatalf("after the restart, applied %s: want the new record once per task and the old ones not again", got)
			}
			if conv["eur"] != "20 40 " {
				t.Fatalf("after the restart, converted %v", conv)
			}
			_ = inst
		})
	}
}
