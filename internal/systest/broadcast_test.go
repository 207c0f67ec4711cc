package systest

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/kstate"
)

var broadcastTable = kstate.Broadcast("table", kstate.String())

// startBroadcastEcho runs the echo job of app with onBroadcast (and onTimer)
// over the broadcast topic "bc", in process, and returns a client of its
// cluster; maxBytes, if set, is the output topic's max.message.bytes.
func startBroadcastEcho(t *testing.T, app, maxBytes string, onBroadcast sluice.BroadcastFunc, onTimer sluice.TimerFunc) (string, *kgo.Client) {
	t.Helper()
	_, brokers := newFaultCluster(t, input, "bc")
	if maxBytes != "" {
		createTopic(t, brokers, output, map[string]*string{"max.message.bytes": kadm.StringPtr(maxBytes)})
	}
	o := options(brokers, app, "i1", t.TempDir(), "echo", sluice.ExactlyOnce)
	o.Job.OnBroadcast, o.Job.OnTimer = onBroadcast, onTimer
	o.BroadcastTopic = "bc"
	startInProcess(t, o).awaitReady(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return brokers, cl
}

func produceOne(t *testing.T, cl *kgo.Client, topic, key, value string) {
	t.Helper()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// An OnBroadcast output the output topic can never accept is dead-lettered
// like a Process output is, and the input goes on committing. (Found by
// review: every epoch that applied it aborted.)
func TestBroadcastPoisonOutputIsDeadLettered(t *testing.T) {
	brokers, cl := startBroadcastEcho(t, "bcp", "2000", func(ctx sluice.Context, rec *sluice.Record) error {
		if err := broadcastTable.Put(ctx, string(rec.Key), string(rec.Value)); err != nil {
			return err
		}
		v := make([]byte, 4000) // above the output topic's max.message.bytes, incompressible
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		ctx.Emit(rec.Key, v)
		return nil
	}, nil)
	produceOne(t, cl, "bc", "b", "big")
	produceOne(t, cl, input, "k", "after")
	dl, err := check.ReadCommitted(context.Background(), []string{brokers}, "bcp-dlq", 30*time.Second, func(r []*kgo.Record) bool { return len(r) > 0 })
	if err != nil || len(dl) == 0 {
		t.Fatalf("the broadcast record whose output can never be produced is not dead-lettered (%v)", err)
	}
	out, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 30*time.Second, func(r []*kgo.Record) bool {
		return slices.ContainsFunc(r, func(x *kgo.Record) bool { return string(x.Value) == "after" })
	})
	if err != nil || !slices.ContainsFunc(out, func(x *kgo.Record) bool { return string(x.Value) == "after" }) {
		t.Fatalf("input 'after' never committed (%d outputs, %v): the broadcast poison blocks the epochs", len(out), err)
	}
}

// A processing-time timer registered from OnBroadcast fires even when no
// input record follows. (Found by review: it waited for the next input.)
func TestTimerFromOnBroadcastFires(t *testing.T) {
	brokers, cl := startBroadcastEcho(t, "bct", "", func(ctx sluice.Context, rec *sluice.Record) error {
		ctx.Timers().RegisterProcessingTime(ctx.Now().Add(200 * time.Millisecond))
		return nil
	}, func(ctx sluice.Context, tm kstate.Timer) error {
		ctx.Emit(tm.Key, []byte("fired"))
		return nil
	})
	produceOne(t, cl, "bc", "b", "x")
	out, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 30*time.Second, func(r []*kgo.Record) bool { return len(r) > 0 })
	if err != nil || len(out) == 0 || string(out[0].Value) != "fired" {
		t.Fatalf("the timer OnBroadcast registered did not fire without an input record (%d outputs, %v)", len(out), err)
	}
}
