package changelog

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Committed is a changelog partition's last committed epoch, as LastMarker
// found it.
type Committed struct {
	// Marker is the last epoch marker, nil when the partition has none.
	Marker *Marker
	// Offset is the marker's offset in the partition, -1 without one.
	Offset int64
	// LastStable is the partition's last stable offset the read stopped
	// at: records of a transaction still open are past it.
	LastStable int64
}

// LastMarker finds the last epoch marker of changelog partition p as a
// restore does (read_committed, reading windows back from the end; see
// Restore), but reads only up to the last stable offset and does not wait
// for an open transaction to end: it is for looking at an app, which must
// not hang on the transaction it is asked to show. Its answer can be one
// epoch behind a running app's; Restore is the one to use for a cut.
func LastMarker(ctx context.Context, adm *kadm.Client, clientOpts []kgo.Opt, topic string, partition int32) (Committed, error) {
	none := Committed{Offset: -1}
	cl, err := kgo.NewClient(clientOpts...)
	if err != nil {
		return none, fmt.Errorf("changelog: client: %w", err)
	}
	defer cl.Close()
	r := restorer{
		p:      RestoreParams{Admin: adm, Topic: topic, Partition: partition},
		reader: newPartitionReader(adm, cl, topic, partition),
	}
	lso, err := r.listed(ctx, adm.ListCommittedOffsets)
	if err != nil {
		return none, err
	}
	none.LastStable = lso
	start, err := r.listed(ctx, adm.ListStartOffsets)
	if err != nil {
		return none, err
	}
	off, err := r.findLastMarker(ctx, start, lso)
	if err != nil || off < 0 {
		return none, err
	}
	c := Committed{Offset: off, LastStable: lso}
	pos := off
	err = r.scan(ctx, &pos, off+1, func(rec *kgo.Record) error {
		if rec.Offset != off || rec.Attrs.IsControl() || !IsMarker(rec.Key) {
			return nil
		}
		m, err := DecodeMarker(rec.Value)
		if err != nil {
			return fmt.Errorf("changelog: %s/%d offset %d: %w", topic, partition, off, err)
		}
		c.Marker = &m
		return nil
	})
	if err != nil {
		return none, err
	}
	if c.Marker == nil {
		// findLastMarker read the same committed range a moment ago.
		return none, fmt.Errorf("changelog: %s/%d: the marker at offset %d is gone", topic, partition, off)
	}
	return c, nil
}
