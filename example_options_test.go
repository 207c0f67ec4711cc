package sluice_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

// New checks the options and the job before any I/O, and names the field
// that is wrong.
func ExampleNew_validation() {
	job := sluice.Job{Name: "count", Emits: true, Process: func(sluice.Context, *sluice.Record) error { return nil }}
	for _, o := range []sluice.Options{
		{Brokers: []string{"kafka:9092"}, AppID: "counter", InstanceID: "counter-1", Job: job, InputTopics: []string{"clicks"}},
		{Brokers: []string{"kafka:9092"}, AppID: "counter", InstanceID: "counter-1", Job: job, InputTopics: []string{"clicks"}, OutputTopic: "counts", Guarantee: "twice"},
		{Brokers: []string{"kafka:9092"}, AppID: "counter", InstanceID: "counter-1", Job: job, InputTopics: []string{"clicks"}, OutputTopic: "counts"},
	} {
		_, err := sluice.New(o)
		fmt.Println(err)
	}
	// Output:
	// sluice: Options.OutputTopic is empty, and job count emits
	// sluice: Options.Guarantee "twice": want exactly_once or at_least_once
	// <nil>
}

// The timing defaults New fills in, derived from the checkpoint interval
// and the session timeout as the processor binary derives them.
func ExampleDefaultTransactionTimeout() {
	for _, interval := range []time.Duration{sluice.DefaultCheckpointInterval, 2 * time.Second} {
		epoch := sluice.Epoch(interval, 0)
		txn := sluice.DefaultTransactionTimeout(epoch)
		fmt.Printf("interval %s: transaction timeout %s, checkpoint timeout %s\n",
			interval, txn, sluice.DefaultCheckpointTimeout(txn, epoch))
	}
	fmt.Printf("session %s: rebalance timeout %s\n",
		sluice.DefaultSessionTimeout, sluice.DefaultRebalanceTimeout(sluice.DefaultSessionTimeout))
	// Output:
	// interval 100ms: transaction timeout 10s, checkpoint timeout 9.9s
	// interval 2s: transaction timeout 20s, checkpoint timeout 18s
	// session 45s: rebalance timeout 30s
}
