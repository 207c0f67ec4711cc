// Package join builds joins of two co-partitioned input topics as
// sluice.Jobs, on the engine's co-processing (several Options.InputTopics,
// one task per partition of all of them, records merged in timestamp
// order) and its keyed state and event-time timers, so a join is exactly
// once as any job is: its buffers commit with the epoch, are changelogged,
// restored and carried by savepoints.
//
// Interval is Flink's interval join (Kafka Streams' windowed KStream-KStream
// join): records of the two topics with the same key whose event times are
// within a bound of each other; inner, or left, right or full outer. Table
// is Kafka Streams' KStream-KTable join: each record of a stream topic
// joined with its key's latest value in a table topic. TableTable is its
// KTable-KTable join: the joined table of two table topics, updated at
// every change of either. Window is Flink's window join: the pairs of each
// window of a key when it fires (package window's windows), or both sides'
// records of the window (CoGroup, for outer joins).
//
//	job, err := join.Interval(join.IntervalSpec{
//		Name: "orders-payments", Left: "orders", Right: "payments",
//		Lower: 0, Upper: 10 * time.Minute, // a payment up to 10 minutes after its order
//		Timestamp: sluice.KafkaTime,
//		Join: func(key []byte, order, payment join.Element) ([]byte, error) {
//			return fmt.Appendf(nil, "%s paid %s", order.Value, payment.Value), nil
//		},
//	})
//	opts.InputTopics = []string{"orders", "payments"}
//
// See docs/joins.md.
package join
