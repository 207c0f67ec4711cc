package sluice_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// A job that writes to a topic no one created (EmitTo "audit") cannot
// commit: every epoch aborts and is replayed. The instance says which topic
// at error level and is not ready; once the topic exists, every input is
// in both topics exactly once.
func TestMissingTopicIsLoggedAndWaitedFor(t *testing.T) {
	const app, inputs = "missing", 400
	var recs []*kgo.Record
	for i := range inputs {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("k%02d", i%20)), Value: []byte(fmt.Sprint(i)), Partition: int32(i % 4)})
	}
	brokers, adm := inputCluster(t, 4, nil)
	produceIn(t, brokers, recs)

	job := sluice.Job{Name: "audited", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		ctx.Emit(rec.Key, rec.Value)
		ctx.EmitTo("audit", rec.Key, rec.Value)
		return nil
	}}
	var mu sync.Mutex
	var msgs []string
	logged := messages{mu: &mu, msgs: &msgs}
	opts := testOptions(brokers, app, job, t.TempDir())
	opts.OutputTopic, opts.Logger = "out", slog.New(logged)
	// A flush that waits for the topic's metadata ends here rather than
	// at the tests' 9 s.
	opts.Checkpoint.Timeout = 3 * time.Second
	r := startInstance(t, opts)

	const missing = "a topic the job writes to does not exist; its epochs abort and are replayed until it is created"
	waitUntil(t, "the missing topic logged", func() bool { return slices.Contains(logged.all(), missing) })
	// Nothing can commit while the topic is missing: every record
	// writes to it.
	if r.inst.Ready() {
		t.Fatal("ready while a topic the job writes to is missing")
	}

	if _, err := adm.CreateTopic(context.Background(), 4, 1, nil, "audit"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every input consumed", func() bool { return consumedAll(adm, app, inputs)(r.inst) })
	waitUntil(t, "ready again", r.inst.Ready)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"out", "audit"} {
		got, err := check.ReadCommitted(context.Background(), brokers, topic, time.Second, check.Settled(inputs))
		if err != nil {
			t.Fatal(err)
		}
		// Outputs are partitioned by key, and each key's inputs are
		// in one input partition: each key's outputs are its inputs,
		// in order.
		byKey := map[string][]string{}
		for _, rec := range got {
			byKey[string(rec.Key)] = append(byKey[string(rec.Key)], string(rec.Value))
		}
		for _, rec := range recs {
			k := string(rec.Key)
			if len(byKey[k]) == 0 || byKey[k][0] != string(rec.Value) {
				t.Fatalf("%s: key %s: next output %v, want %s", topic, k, byKey[k][:min(1, len(byKey[k]))], rec.Value)
			}
			byKey[k] = byKey[k][1:]
		}
		for k, rest := range byKey {
			if len(rest) > 0 {
				t.Fatalf("%s: key %s: %d outputs more than inputs", topic, k, len(rest))
			}
		}
	}
}
