package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// Output returns the records committed to the job's output topic so far.
// See Records.
func (h *Harness) Output() []sluice.Record {
	h.t.Helper()
	return h.Records(OutputTopic)
}

// SideOutput returns the records committed to the side output tag so far,
// whose topic the harness names after the tag. See Records.
func (h *Harness) SideOutput(tag sluice.OutputTag) []sluice.Record {
	h.t.Helper()
	if !slices.Contains(h.job.SideOutputs, tag) {
		h.t.Fatalf("sluicetest: job %s declares no side output %q", h.job.Name, tag)
	}
	return h.Records(string(tag))
}

// DeadLetters returns the records committed to the dead-letter topic so
// far: the records and timers the job failed on, with headers saying why
// (sluice.stage, sluice.error, …). See Records.
func (h *Harness) DeadLetters() []sluice.Record {
	h.t.Helper()
	return h.Records(DeadLetterTopic)
}

// Records returns every committed record of topic, read from the start as
// a read_committed consumer reads it: records of aborted transactions
// never show, nor those of a transaction still open. They come in
// partition order, then offset order, and include what a killed instance
// committed before it died; a fresh reader reads them at each call. Call
// Settle first to read what the records sent so far caused.
func (h *Harness) Records(topic string) []sluice.Record {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.Timeout)
	defer cancel()
	recs, err := h.read(ctx, topic)
	if err != nil {
		h.t.Fatalf("sluicetest: read %s: %v", topic, err)
	}
	return recs
}

// read consumes every partition of topic up to its last stable offset, the
// end of what is committed (check.ReadToEnd).
func (h *Harness) read(ctx context.Context, topic string) ([]sluice.Record, error) {
	recs, err := check.ReadToEnd(ctx, h.brokers, topic, kgo.ReadCommitted())
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		err = fmt.Errorf("%w (Options.Topics creates more topics)", err)
	}
	if err != nil {
		return nil, err
	}
	out := make([]sluice.Record, 0, len(recs))
	for _, r := range recs {
		out = append(out, record(r))
	}
	return out, nil
}

func record(r *kgo.Record) sluice.Record {
	out := sluice.Record{
		Key:       r.Key,
		Value:     r.Value,
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Timestamp: r.Timestamp,
	}
	for _, hd := range r.Headers {
		out.Headers = append(out.Headers, sluice.Header{Key: hd.Key, Value: hd.Value})
	}
	return out
}
