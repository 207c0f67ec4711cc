package changelog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// partitionReader reads one changelog partition with direct fetches to its
// leader, read_committed, control records kept. A consumer that polls in
// vain cannot tell a slow broker from a range that compaction emptied, and
// one that fetched past a range's end has buffered records the next range
// needs. A direct fetch answers both: a broker always returns the first
// batch at or after the fetch offset, even one larger than the size limit
// (KIP-74), so an answer without batches means nothing is left below the
// last stable offset; and franz-go's ProcessFetchPartition gives the
// records and the offset after every batch it read, including aborted,
// empty and compacted ones that hold no record for us.
type partitionReader struct {
	adm       *kadm.Client
	cl        *kgo.Client // for its brokers; it consumes nothing
	topic     string
	partition int32
	id        [16]byte
	leader    int32 // -1 until known
	epoch     int32 // the leader's epoch, so a deposed leader answers FENCED_LEADER_EPOCH
	dec       kgo.Decompressor
}

// fetched is one fetch's answer.
type fetched struct {
	recs []*kgo.Record
	next int64 // the offset after the last batch read (the fetch offset if none)
	lso  int64 // the partition's last stable offset, as the answering broker knows it
}

func newPartitionReader(adm *kadm.Client, cl *kgo.Client, topic string, partition int32) *partitionReader {
	return &partitionReader{adm: adm, cl: cl, topic: topic, partition: partition, leader: -1, dec: kgo.DefaultDecompressor()}
}

const readerFetchBytes = 8 << 20

// fetch returns the records at or after pos that one fetch brings, with
// the offset after the last batch it read and the answering leader's last
// stable offset.
func (r *partitionReader) fetch(ctx context.Context, pos int64) (fetched, error) {
	backoff := 50 * time.Millisecond
	for {
		f, err := r.fetchOnce(ctx, pos)
		if err == nil || ctx.Err() != nil {
			return f, err
		}
		var ke *kerr.Error
		if !errors.As(err, &ke) || !ke.Retriable {
			return fetched{next: pos}, err
		}
		r.leader = -1 // leadership moved, or the broker is busy: look again
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fetched{next: pos}, ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// forget drops the known leader: the next fetch looks it up again.
func (r *partitionReader) forget() { r.leader = -1 }

func (r *partitionReader) fetchOnce(ctx context.Context, pos int64) (fetched, error) {
	none := fetched{next: pos}
	if r.leader < 0 {
		md, err := r.adm.Metadata(ctx, r.topic)
		if err != nil {
			return none, fmt.Errorf("changelog: metadata of %s: %w", r.topic, err)
		}
		td, ok := md.Topics[r.topic]
		if !ok || td.Err != nil {
			return none, fmt.Errorf("changelog: metadata of %s: %w", r.topic, td.Err)
		}
		pd, ok := td.Partitions[r.partition]
		if !ok {
			return none, fmt.Errorf("changelog: %s has no partition %d", r.topic, r.partition)
		}
		if pd.Err != nil {
			return none, fmt.Errorf("changelog: metadata of %s/%d: %w", r.topic, r.partition, pd.Err)
		}
		r.id, r.leader, r.epoch = td.ID, pd.Leader, pd.LeaderEpoch
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 500
	req.MinBytes = 1
	req.MaxBytes = readerFetchBytes
	req.IsolationLevel = 1 // read_committed
	req.SessionEpoch = -1  // no fetch session
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = r.topic, r.id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = r.partition
	rp.FetchOffset = pos
	rp.CurrentLeaderEpoch = r.epoch
	rp.LogStartOffset = -1
	rp.PartitionMaxBytes = readerFetchBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, r.cl.Broker(int(r.leader)))
	if err != nil {
		return none, fmt.Errorf("changelog: fetch %s/%d at %d: %w", r.topic, r.partition, pos, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return none, fmt.Errorf("changelog: fetch %s/%d at %d: %w", r.topic, r.partition, pos, err)
	}
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			p := &resp.Topics[i].Partitions[j]
			if p.Partition != r.partition {
				continue
			}
			fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
				KeepControlRecords: true,
				Offset:             pos,
				IsolationLevel:     kgo.ReadCommitted(),
				Topic:              r.topic,
				Partition:          r.partition,
			}, p, r.dec, nil)
			if fp.Err != nil {
				return none, fmt.Errorf("changelog: fetch %s/%d at %d: %w", r.topic, r.partition, pos, fp.Err)
			}
			return fetched{recs: fp.Records, next: max(next, pos), lso: fp.LastStableOffset}, nil
		}
	}
	return none, fmt.Errorf("changelog: fetch %s/%d at %d: partition missing from the answer", r.topic, r.partition, pos)
}
