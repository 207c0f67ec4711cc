package join_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/join"
	"github.com/sluicehq/sluice/window"
)

// Orders joined with their payments, a payment up to ten minutes after its
// order; an instance runs the job over both topics.
func ExampleInterval() {
	job, err := join.Interval(join.IntervalSpec{
		Name: "orders-payments", Left: "orders", Right: "payments",
		Lower: 0, Upper: 10 * time.Minute,
		Timestamp: sluice.KafkaTime,
		Join: func(key []byte, order, payment join.Element) ([]byte, error) {
			return fmt.Appendf(nil, "%s paid %s after %s", key, payment.Value, payment.Timestamp.Sub(order.Timestamp)), nil
		},
	})
	if err != nil {
		panic(err)
	}
	opts := sluice.Options{Job: job, InputTopics: []string{"orders", "payments"}, OutputTopic: "paid-orders"}
	fmt.Println(opts.Job.Name, opts.Job.States)
	// Output: orders-payments [orders-payments.left orders-payments.right orders-payments.late-dropped]
}

// Clicks joined with the page views of the same user in the same minute; an
// instance runs the job over both topics.
func ExampleWindow() {
	job, err := join.Window(join.WindowSpec{
		Name: "clicks-views", Left: "clicks", Right: "views",
		Assigner:  window.TumblingEventTime(time.Minute),
		Timestamp: sluice.KafkaTime,
		Join: func(key []byte, w window.Window, click, view join.Element) ([]byte, error) {
			return fmt.Appendf(nil, "%s clicked %s after viewing %s in %s", key, click.Value, view.Value, w), nil
		},
	})
	if err != nil {
		panic(err)
	}
	opts := sluice.Options{Job: job, InputTopics: []string{"clicks", "views"}, OutputTopic: "clicks-in-context"}
	fmt.Println(opts.Job.Name, opts.Job.States)
	// Output: clicks-views [clicks-views.windows clicks-views.elements clicks-views.late-dropped]
}
