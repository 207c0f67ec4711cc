package window_test

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
	"github.com/sluicehq/sluice/window"
)

// Clicks per user in 10-second tumbling windows of event time (the Kafka
// record time), counted with Reduce; the window's result is emitted keyed
// by user when the watermark reaches its end, and a click later than that
// goes to the side output.
func ExampleJob() {
	late := sluice.OutputTag("late")
	job, err := window.Job(window.Spec[int64, int64]{
		Name:     "clicks",
		Assigner: window.TumblingEventTime(10 * time.Second),
		Function: window.Reduce(kstate.Int64(), func(a, b int64) int64 { return a + b }),
		Decode:   func(*sluice.Record) (int64, error) { return 1, nil },
		Encode: func(key []byte, w window.Window, n int64) ([]byte, error) {
			return fmt.Appendf(nil, "%s %d", w.Start.Format("15:04:05"), n), nil
		},
		Timestamp:  sluice.KafkaTime,
		LateOutput: late,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = sluicetest.Run(func(t sluicetest.TB) {
		h := sluicetest.New(t, job, sluicetest.Options{})
		t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
		for i, s := range []int{1, 3, 9, 12, 4, 25} { // seconds after t0
			h.Send([]byte("ann"), []byte(strconv.Itoa(i)), t0.Add(time.Duration(s)*time.Second))
		}
		h.Settle()
		for _, r := range h.Output() {
			fmt.Printf("%s: %s\n", r.Key, r.Value)
		}
		for _, r := range h.SideOutput(late) {
			fmt.Printf("late: click %s\n", r.Value)
		}
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// ann: 12:00:00 3
	// ann: 12:00:10 1
	// late: click 4
}
