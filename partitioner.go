package sluice

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

type explicitKey struct{}

// explicitCtx, set as a record's Context, marks a record whose Partition is
// already chosen (changelog records go to their task's partition; echo
// copies partitions). One shared value: no allocation per record.
var explicitCtx = context.WithValue(context.Background(), explicitKey{}, true)

// partitioner sends explicitly placed records to their partition and every
// other record by key with Kafka's default murmur2 hash, so consumers that
// rely on Kafka's default partitioning find keys where they expect them.
type partitioner struct{ byKey kgo.Partitioner }

func newPartitioner() kgo.Partitioner {
	return partitioner{byKey: kgo.StickyKeyPartitioner(nil)}
}

func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return topicPartitioner{byKey: p.byKey.ForTopic(topic)}
}

type topicPartitioner struct{ byKey kgo.TopicPartitioner }

func (t topicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return isExplicit(r) || t.byKey.RequiresConsistency(r)
}

func (t topicPartitioner) Partition(r *kgo.Record, n int) int {
	if isExplicit(r) {
		return int(r.Partition)
	}
	return t.byKey.Partition(r, n)
}

func isExplicit(r *kgo.Record) bool {
	if c, ok := r.Context.(*outCtx); ok {
		return c.explicit
	}
	return r.Context == explicitCtx
}

// outCtx is the Context of a record the engine produces from a task's
// slab (see task.record): whether its partition is explicit, and for an
// output, the input it came from, which its promise needs when it fails.
// It carries no deadline and is never cancelled.
type outCtx struct {
	context.Context
	explicit bool
	task     int32
	ref      inputRef
	dlq      bool
	// slot is the record's place when task.record made it, for recycle.
	slot *outSlot
}

// outSlot is one record of a slab with its Context beside it.
type outSlot struct {
	rec kgo.Record
	ctx outCtx
}

// slabLen is how many records one slab allocation holds.
const slabLen = 64

// byKey is Kafka's default partitioner for keyed records (murmur2 of the
// key): keyPartition's. Its Partition keeps no state for a record with a
// key, so one serves every goroutine.
var byKey = kgo.StickyKeyPartitioner(nil).ForTopic("")

// keyPartition is the partition of n that Kafka's default partitioner gives
// a record with key (non-empty): where a query finds the key's task, and
// where a rescaled savepoint's entry goes.
func keyPartition(key []byte, n int32) int32 {
	return int32(byKey.Partition(&kgo.Record{Key: key}, int(n)))
}
