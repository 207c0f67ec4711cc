package systest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/kstate"
)

// history is the co-processing job of these tests: per key, the sequence of
// every record it saw from either input, as "topic:value", and one output
// per record carrying that sequence so far. Its output depends on the order
// in which the two inputs' records are interleaved, so equal outputs mean
// equal orders.
var history = kstate.Value[string]("history", kstate.String())

var historyJob = sluice.Job{
	Name:   "history",
	Emits:  true,
	States: []string{history.Name()},
	Process: func(ctx sluice.Context, rec *sluice.Record) error {
		h, _, err := history.Get(ctx)
		if err != nil {
			return err
		}
		h += rec.Topic + ":" + string(rec.Value) + ";"
		if err := history.Set(ctx, h); err != nil {
			return err
		}
		ctx.Emit(rec.Key, []byte(h))
		return nil
	},
}

// produceBoth writes n records to each of the two inputs, keyed over 20
// keys, with timestamps that interleave the two topics, and returns the
// count of records.
func produceBoth(t *testing.T, brokers string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(31, 32))
	base := time.UnixMilli(1_700_000_000_000)
	var recs []*kgo.Record
	for i := range n {
		for j, topic := range []string{input, input2} {
			key := fmt.Sprintf("k%d", rng.IntN(20))
			ts := base.Add(time.Duration(2*i+j*(1+rng.IntN(3))) * time.Millisecond)
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(fmt.Sprint(i)), Timestamp: ts})
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return recs
}

// expectedHistory is each key's outputs when every task takes its two
// inputs' records in timestamp order, ties to the first input topic (the
// ordering rule of copartition.go): a key lives in one task, and within a
// topic a key's records keep their produce order.
func expectedHistory(recs []*kgo.Record) map[string][]string {
	sorted := slices.Clone(recs)
	slices.SortStableFunc(sorted, func(a, b *kgo.Record) int {
		if c := a.Timestamp.Compare(b.Timestamp); c != 0 {
			return c
		}
		return strings.Compare(a.Topic, b.Topic) // "in" before "in2"
	})
	out, h := map[string][]string{}, map[string]string{}
	for _, r := range sorted {
		k := string(r.Key)
		h[k] += r.Topic + ":" + string(r.Value) + ";"
		out[k] = append(out[k], h[k])
	}
	return out
}

// outputsByKey reads the committed output and returns each key's output
// values in order.
func outputsByKey(t *testing.T, brokers string, want int) map[string][]string {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, awaitIdle, check.Settled(want))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, r := range recs {
		out[string(r.Key)] = append(out[string(r.Key)], string(r.Value))
	}
	return out
}

// A co-process job over two topics of 4 partitions: run once without
// faults, then on a second cluster with the same input with its instances
// killed with -9 and restarted mid-run. The outputs are the same, record
// for record: exactly once, and in the same interleaving of the inputs.
func TestCoProcessKilledEqualsFaultFree(t *testing.T) {
	var want map[string][]string
	run := func(kill bool) map[string][]string {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, input, input2, output), kip848Heartbeat)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		brokers := c.ListenAddrs()[0]
		recs := produceBoth(t, brokers, 3000)
		n := len(recs)
		if want == nil {
			want = expectedHistory(recs)
		}
		var children []*child
		for i := range 2 {
			id := fmt.Sprintf("i%d", i+1)
			ch := newChild(t, brokers, "copro", id, filepath.Join(t.TempDir(), "state"), "history", sluice.ExactlyOnce)
			ch.start()
			children = append(children, ch)
		}
		if kill {
			for round := range 3 {
				victim := children[round%2]
				// Killed while the input is a quarter, a half,
				// three quarters processed.
				outputsByKeyAtLeast(t, brokers, n*(round+1)/4)
				victim.signal(syscall.SIGKILL)
				victim.wait(10 * time.Second)
				victim.start()
			}
		}
		out := outputsByKey(t, brokers, n)
		for _, ch := range children {
			ch.signal(syscall.SIGTERM)
			ch.wait(30 * time.Second)
		}
		total := 0
		for _, vs := range out {
			total += len(vs)
		}
		if total != n {
			t.Fatalf("kill=%v: %d outputs for %d inputs", kill, total, n)
		}
		return out
	}
	clean, faulty := run(false), run(true)
	for k, w := range want {
		for name, out := range map[string]map[string][]string{"fault-free": clean, "with kills": faulty} {
			if got := out[k]; strings.Join(got, "\n") != strings.Join(w, "\n") {
				t.Fatalf("key %s, %s: the outputs are not the inputs in timestamp order:\n got  %d outputs, last %q\n want %d outputs, last %q",
					k, name, len(got), last(got), len(w), last(w))
			}
		}
	}
}

// outputsByKeyAtLeast waits until the output holds n committed records.
func outputsByKeyAtLeast(t *testing.T, brokers string, n int) {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, awaitIdle,
		func(r []*kgo.Record) bool { return len(r) >= n })
	if err != nil || len(recs) < n {
		t.Fatalf("outputs: %d of %d (%v)", len(recs), n, err)
	}
}

func last(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// Input topics of different partition counts are refused at start, saying
// which.
func TestCoProcessRefusesUnequalPartitions(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, input, output), kfake.SeedTopics(6, input2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := options(c.ListenAddrs()[0], "unequal", "i1", t.TempDir(), "history", sluice.ExactlyOnce)
	cfg.Registry = prometheus.NewRegistry()
	inst, err := sluice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = inst.Run(ctx)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "input topics are not co-partitioned: in2 has 6 partitions, expected 4") {
		t.Fatalf("Run = %v, want a refusal naming in2's 6 partitions", err)
	}
}
