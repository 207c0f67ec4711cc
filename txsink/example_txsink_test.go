package txsink_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/txsink"
)

// Two epochs of a consume-transform-produce loop, the engine's in
// miniature: the first aborts, so its output never reaches a read_committed
// reader and its input is read again; the second commits its output and its
// input offsets in one transaction.
func Example() {
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	prod, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"))
	defer prod.Close()
	prod.ProduceSync(ctx, &kgo.Record{Value: []byte("a")}, &kgo.Record{Value: []byte("b")})

	s, err := txsink.NewExactlyOnce(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup("upper"), kgo.ConsumeTopics("in"),
		kgo.TransactionalID("upper-1"),
		kgo.BlockRebalanceOnPoll(), kgo.DisableAutoCommit(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()

	epoch := func(commit bool) {
		var in []*kgo.Record
		for len(in) < 2 && ctx.Err() == nil {
			in = append(in, s.PollRecords(ctx, 10).Records()...)
		}
		if err := s.Begin(); err != nil {
			fmt.Println(err)
			return
		}
		for _, r := range in {
			s.Produce(ctx, &kgo.Record{Topic: "out", Value: bytes.ToUpper(r.Value)}, nil)
		}
		committed, err := s.End(ctx, commit, nil)
		fmt.Printf("epoch of %d records: committed %v, err %v\n", len(in), committed, err)
		s.AllowRebalance()
	}
	epoch(false)
	epoch(true)

	reader, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("out"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer reader.Close()
	for read := 0; read < 2 && ctx.Err() == nil; {
		reader.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			fmt.Printf("out: %s\n", r.Value)
			read++
		})
	}
	// Output:
	// epoch of 2 records: committed false, err <nil>
	// epoch of 2 records: committed true, err <nil>
	// out: A
	// out: B
}
