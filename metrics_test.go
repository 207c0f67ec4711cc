package sluice

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/txsink"
)

// The transaction results exist before the first epoch ends, so an alert
// on increase(sluice_transactions_total{result="abort"}) sees the first
// abort.
func TestTransactionSeriesExistFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := register(reg, instanceMetrics()...); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_transactions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					results[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if v, ok := results["abort"]; !ok || v != 0 || len(results) != 2 {
		t.Fatalf("sluice_transactions_total at start: %v, want commit and abort at 0", results)
	}
}

// instanceMetrics are the collectors of an instance's metrics and of a
// sink's.
func instanceMetrics() []prometheus.Collector {
	_, cs := newMetrics(&Instance{})
	_, scs := newSinkMetrics()
	return append(cs, scs...)
}

// A registry that holds an Instance's metrics refuses a second Instance's
// with an error that says what to do, not a panic. A refusal registers
// nothing: here the last metric's name is taken, and none of the ones
// before it stays. One registry wrapped for each instance with a label
// value of its own takes both.
func TestSharedRegistryIsRefusedClearly(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := register(reg, instanceMetrics()...); err != nil {
		t.Fatal(err)
	}
	err := register(reg, instanceMetrics()...)
	if err == nil || !strings.Contains(err.Error(), "give each Instance a registry of its own") {
		t.Fatalf("second instance's metrics: %v, want the registry refused", err)
	}

	taken := prometheus.NewRegistry()
	last := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_sink_pending_transactions", Help: "taken"})
	if err := taken.Register(last); err != nil {
		t.Fatal(err)
	}
	if err := register(taken, instanceMetrics()...); err == nil {
		t.Fatal("registered over a taken name")
	}
	mfs, err := taken.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "sluice_sink_pending_transactions" {
		var names []string
		for _, mf := range mfs {
			names = append(names, mf.GetName())
		}
		t.Fatalf("after the refusal the registry holds %v, want only the name taken before", names)
	}

	shared := prometheus.NewRegistry()
	for _, id := range []string{"a", "b"} {
		wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"instance": id}, shared)
		if err := register(wrapped, instanceMetrics()...); err != nil {
			t.Fatalf("instance %s in a wrapped registry: %v", id, err)
		}
	}
}

// Close unregisters an Instance's metrics, the sink's too, from a plain
// or a wrapped registry, so a new Instance can take it, and closes the
// job once; it refuses while Run runs, Run refuses after it, and a second
// Close does nothing. The
// proof that nothing stayed is the next New on the registry: vectors
// without series do not show in a Gather.
func TestCloseUnregistersMetrics(t *testing.T) {
	for _, tc := range []struct {
		name string
		reg  func(prometheus.Registerer) prometheus.Registerer
		sink bool
	}{
		{"plain", func(r prometheus.Registerer) prometheus.Registerer { return r }, false},
		{"sink", func(r prometheus.Registerer) prometheus.Registerer { return r }, true},
		{"wrapped", func(r prometheus.Registerer) prometheus.Registerer {
			return prometheus.WrapRegistererWith(prometheus.Labels{"instance": "a"}, r)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shared := prometheus.NewRegistry()
			jobCloses := 0
			opts := func() Options {
				o := Options{Brokers: []string{"127.0.0.1:1"}, AppID: "close", InstanceID: "i", InputTopics: []string{"in"},
					Job: Job{Name: "noop", Process: func(Context, *Record) error { return nil },
						Close: func() error { jobCloses++; return nil }},
					StateDir: t.TempDir(), Backend: kstate.MemoryBackend, Registry: tc.reg(shared)}
				if tc.sink {
					o.Sink = nopSink{}
				}
				return o
			}
			first, err := New(opts())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := New(opts()); err == nil || !strings.Contains(err.Error(), "Close that Instance") {
				t.Fatalf("a second Instance on the registry: %v, want refused", err)
			}

			first.running.Store(true) // as while Run runs
			if err := first.Close(); err == nil || !strings.Contains(err.Error(), "while Run is running") {
				t.Fatalf("Close while Run runs: %v", err)
			}
			if _, err := New(opts()); err == nil {
				t.Fatal("a refused Close unregistered the metrics")
			}
			if jobCloses != 0 {
				t.Fatal("a refused Close closed the job")
			}
			first.running.Store(false)

			// A Run that returned (here at once: its context is done)
			// leaves the instance to Close.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := first.Run(ctx); err != nil {
				t.Fatalf("Run with its context done: %v", err)
			}
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			if err := first.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if jobCloses != 1 {
				t.Fatalf("the job was closed %d times by two Closes, want once", jobCloses)
			}
			if err := first.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "after Close") {
				t.Fatalf("Run after Close: %v", err)
			}
			second, err := New(opts())
			if err != nil {
				t.Fatalf("New on the registry after Close: %v", err)
			}
			if err := second.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A NewPipeline that refuses a stage lets go of the metrics of the stages
// it built before it, so the same registry takes the pipeline once fixed,
// and leaves their jobs open for that next try; Pipeline.Close lets go of
// every stage's metrics and closes every stage's job.
func TestPipelineRefusalAndCloseLetGoOfMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := Options{Brokers: []string{"127.0.0.1:1"}, AppID: "pclose", InstanceID: "i", InputTopics: []string{"in"},
		StateDir: t.TempDir(), Backend: kstate.MemoryBackend, Registry: reg}
	closes := 0
	ok := Job{Name: "noop", Process: func(Context, *Record) error { return nil }, Close: func() error { closes++; return nil }}
	if _, err := NewPipeline(opts, Stage{Name: "a", Job: ok}, Stage{Name: "b", Job: Job{Name: "broken"}}); err == nil {
		t.Fatal("a stage without Process was taken")
	}
	if closes != 0 {
		t.Fatalf("a refused NewPipeline closed %d jobs, want none", closes)
	}
	p, err := NewPipeline(opts, Stage{Name: "a", Job: ok}, Stage{Name: "b", Job: ok})
	if err != nil {
		t.Fatalf("the fixed pipeline on the same registry: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if closes != 2 {
		t.Fatalf("Pipeline.Close closed %d jobs, want the two stages'", closes)
	}
	p, err = NewPipeline(opts, Stage{Name: "a", Job: ok}, Stage{Name: "b", Job: ok})
	if err != nil {
		t.Fatalf("a pipeline after Close: %v", err)
	}
	_ = p.Close()
}

// nopSink is a txsink.EpochSink for tests that never run the instance.
type nopSink struct{}

func (nopSink) Setup(context.Context) error                         { return nil }
func (nopSink) Check([]any) error                                   { return nil }
func (nopSink) Begin(int32) txsink.EpochTxn                         { panic("not run") }
func (nopSink) Claim(context.Context, int32) (txsink.Claim, error)  { panic("not run") }
func (nopSink) Recover(context.Context, txsink.Claim, string) error { panic("not run") }
func (nopSink) Commit(context.Context, txsink.TxnID) error          { panic("not run") }
func (nopSink) Abort(context.Context, txsink.TxnID) error           { panic("not run") }
func (nopSink) Close()                                              {}

// A job's Close that fails makes Instance.Close fail, naming the job; the
// instance's metrics are let go of all the same.
func TestCloseReportsTheJobsCloseError(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := Options{Brokers: []string{"127.0.0.1:1"}, AppID: "jclose", InstanceID: "i", InputTopics: []string{"in"},
		Job: Job{Name: "leaky", Process: func(Context, *Record) error { return nil },
			Close: func() error { return errors.New("still held") }},
		StateDir: t.TempDir(), Backend: kstate.MemoryBackend, Registry: reg}
	in, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Close(); err == nil || !strings.Contains(err.Error(), "job leaky: still held") {
		t.Fatalf("Close: %v, want the job's error", err)
	}
	opts.Job.Close = nil
	again, err := New(opts)
	if err != nil {
		t.Fatalf("New on the registry after a Close whose job failed: %v", err)
	}
	_ = again.Close()
}
