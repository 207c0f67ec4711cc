package sluice

import (
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// murmur2 is Kafka's Utils.murmur2, written out from the Java source, so the
// test does not trust the code under test for what "Kafka's default
// partitioner" means.
func murmur2(data []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	length := len(data)
	h := seed ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch rest := data[length&^3:]; len(rest) {
	case 3:
		h ^= uint32(rest[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(rest[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(rest[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

func TestPartitionerKeyedIsKafkaDefault(t *testing.T) {
	tp := newPartitioner().ForTopic("out")
	for _, n := range []int{1, 3, 6, 12} {
		for i := range 500 {
			key := []byte("key-" + strconv.Itoa(i))
			want := int(murmur2(key)&0x7fffffff) % n
			r := &kgo.Record{Topic: "out", Key: key}
			if !tp.RequiresConsistency(r) {
				t.Fatal("keyed records must always hash to the same partition")
			}
			if got := tp.Partition(r, n); got != want {
				t.Fatalf("key %q over %d partitions: %d, Kafka's default gives %d", key, n, got, want)
			}
		}
	}
}

func TestPartitionerExplicit(t *testing.T) {
	tp := newPartitioner().ForTopic("changelog")
	r := &kgo.Record{Topic: "changelog", Key: []byte("anything"), Partition: 4, Context: explicitCtx}
	if got := tp.Partition(r, 6); got != 4 || !tp.RequiresConsistency(r) {
		t.Fatalf("explicit partition 4: got %d", got)
	}
}
