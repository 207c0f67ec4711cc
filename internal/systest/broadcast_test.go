package systest

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/kstate"
)

var broadcastTable = kstate.Broadcast("table", kstate.String())

// An OnBroadcast output the output topic can never accept must be
// dead-lettered like a Process output is; otherwise nothing ever commits.
func TestBroadcastPoisonOutputIsDeadLettered(t *testing.T) {
	_, brokers := newFaultCluster(t, input, "bc")
	createTopic(t, brokers, output, map[string]*string{"max.message.bytes": kadm.StringPtr("2000")})
	s := newSender(t, brokers)
	o := options(brokers, "bcp", "i1", t.TempDir(), "echo", sluice.ExactlyOnce)
	j := o.Job
	j.OnBroadcast = func(ctx sluice.Context, rec *sluice.Record) error {
		if err := broadcastTable.Put(ctx, string(rec.Key), string(rec.Value)); err != nil {
			return err
		}
		v := rec.Value
		if string(v) == "big" {
			rng := rand.New(rand.NewPCG(1, 2))
			v = make([]byte, 4000)
			for i := range v {
				v[i] = byte(rng.Uint32())
			}
		}
		ctx.Emit(rec.Key, v)
		return nil
	}
	o.Job = j
	o.BroadcastTopic = "bc"
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := startInProcess(t, o)
	p.awaitReady(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "bc", Key: []byte("b"), Value: []byte("big")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	s.send("k", "after")
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 20*time.Second,
		func(r []*kgo.Record) bool {
			for _, x := range r {
				if string(x.Value) == "after" {
					return true
				}
			}
			return false
		})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		t.Logf("out %s=%d bytes", r.Key, len(r.Value))
	}
	dl, _ := check.ReadCommitted(context.Background(), []string{brokers}, "bcp-dlq", 15*time.Second, func(r []*kgo.Record) bool { return len(r) > 0 })
	if len(dl) == 0 {
		t.Fatalf("after 15s the broadcast record whose output can never be produced is not dead-lettered (every epoch that applies it aborts)")
	}
	for _, r := range recs {
		if string(r.Value) == "after" {
			return
		}
	}
	t.Fatalf("input 'after' never committed (%d outputs): the broadcast poison blocks every epoch", len(recs))
}

// A processing-time timer registered from OnBroadcast fires on time even
// when no input record follows.
func TestTimerFromOnBroadcastFires(t *testing.T) {
	_, brokers := newFaultCluster(t, input, "bc", output)
	o := options(brokers, "bct", "i1", t.TempDir(), "echo", sluice.ExactlyOnce)
	j := o.Job
	j.OnBroadcast = func(ctx sluice.Context, rec *sluice.Record) error {
		ctx.Timers().RegisterProcessingTime(time.Now().Add(200 * time.Millisecond))
		return nil
	}
	j.OnTimer = func(ctx sluice.Context, tm kstate.Timer) error {
		ctx.Emit(tm.Key, []byte("fired"))
		return nil
	}
	o.Job = j
	o.BroadcastTopic = "bc"
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := startInProcess(t, o)
	p.awaitReady(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "bc", Key: []byte("b"), Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	recs, _ := check.ReadCommitted(context.Background(), []string{brokers}, output, 10*time.Second, func(r []*kgo.Record) bool { return len(r) > 0 })
	if len(recs) == 0 {
		newSender(t, brokers).send("k", "poke")
		recs, _ = check.ReadCommitted(context.Background(), []string{brokers}, output, 10*time.Second, check.Settled(2))
		for _, r := range recs {
			t.Logf("after an input: %s=%s", r.Key, r.Value)
		}
		t.Fatal("the timer OnBroadcast registered did not fire within 10s (no input record came to take its floor)")
	}
}
