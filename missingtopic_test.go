package sluice_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
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
	logged := &missingTopicLines{}
	opts := testOptions(brokers, app, job, t.TempDir())
	opts.OutputTopic, opts.Logger = "out", slog.New(logged)
	// A flush that waits for the topic's metadata ends here rather than
	// at the tests' 9 s.
	opts.Checkpoint.Timeout = 3 * time.Second
	r := startInstance(t, opts)
	logged.inst.Store(r.inst)

	// Nothing can commit while the topic is missing: every record
	// writes to it. The line is logged as an epoch aborts, on the loop
	// that sets readiness, so the instance is not ready when it is.
	waitUntil(t, "the missing topic logged", func() bool { return len(logged.all()) > 0 })
	if line := logged.all()[0]; line.level != slog.LevelError || line.topic != "audit" || line.ready {
		t.Fatalf("logged %+v; want an error naming topic audit, while not ready", line)
	}
	// And it stays not ready through the replay, until the next abort
	// says so again.
	waitUntil(t, "the missing topic logged again", func() bool {
		if r.inst.Ready() {
			t.Fatal("ready again while the topic is still missing")
		}
		return len(logged.all()) > 1
	})

	if _, err := adm.CreateTopic(context.Background(), 4, 1, nil, "audit"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every input consumed", func() bool { return consumedAll(adm, app, inputs)(r.inst) })
	waitUntil(t, "ready again", r.inst.Ready)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"out", "audit"} {
		got, err := check.ReadCommitted(context.Background(), brokers, topic, 30*time.Second, check.Settled(inputs))
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

// missingTopicLines is a slog.Handler that keeps the missing-topic lines:
// their level, their topic, and whether the instance was ready as each
// was logged.
type missingTopicLines struct {
	inst  atomic.Pointer[sluice.Instance]
	mu    sync.Mutex
	lines []missingTopicLine
}

type missingTopicLine struct {
	level slog.Level
	topic string
	ready bool
}

func (m *missingTopicLines) Enabled(context.Context, slog.Level) bool { return true }
func (m *missingTopicLines) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "a topic the job writes to does not exist; its epochs abort and are replayed until it is created" {
		return nil
	}
	line := missingTopicLine{level: r.Level}
	if inst := m.inst.Load(); inst != nil {
		line.ready = inst.Ready()
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "topic" {
			line.topic = a.Value.String()
		}
		return true
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lines = append(m.lines, line)
	return nil
}
func (m *missingTopicLines) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *missingTopicLines) WithGroup(string) slog.Handler      { return m }

func (m *missingTopicLines) all() []missingTopicLine {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.lines)
}
