package changelog

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// recordsFrom reports whether the partition holds any record batch (data,
// aborted data or a transaction marker) that starts below end, at or after
// the batch that holds from, asking its leader
// directly with a fetch that does not wait. A broker always returns the
// first batch at or after the fetch offset, even one larger than the size
// limit (KIP-74), so an answer without batches means compaction removed
// everything in between: the position may jump to the end. A consumer that
// polls in vain cannot tell that apart from a slow broker.
func recordsFrom(ctx context.Context, adm *kadm.Client, cl *kgo.Client, topic string, partition int32, from, end int64) (bool, error) {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return false, fmt.Errorf("changelog: metadata of %s: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return false, fmt.Errorf("changelog: metadata of %s: %v", topic, td.Err)
	}
	pd, ok := td.Partitions[partition]
	if !ok || pd.Err != nil {
		return false, fmt.Errorf("changelog: metadata of %s/%d: %v", topic, partition, pd.Err)
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 1
	req.MaxBytes = 1 << 20
	req.IsolationLevel = 1 // read_committed: answers stop at the last stable offset
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	rt.TopicID = td.ID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = partition
	rp.FetchOffset = from
	rp.CurrentLeaderEpoch = -1
	rp.LogStartOffset = -1
	rp.PartitionMaxBytes = 1 << 20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl.Broker(int(pd.Leader)))
	if err != nil {
		return false, fmt.Errorf("changelog: fetch %s/%d at %d: %w", topic, partition, from, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return false, fmt.Errorf("changelog: fetch %s/%d at %d: %w", topic, partition, from, err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.Partition != partition {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return false, fmt.Errorf("changelog: fetch %s/%d at %d: %w", topic, partition, from, err)
			}
			// Batches begin with their base offset; one that begins at
			// or past end holds nothing of the range.
			b := p.RecordBatches
			return len(b) >= 8 && int64(binary.BigEndian.Uint64(b)) < end, nil
		}
	}
	return false, fmt.Errorf("changelog: fetch %s/%d at %d: partition missing from the answer", topic, partition, from)
}
