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

// The mean of each sensor's last three readings, every second reading:
// Flink's countWindow(3, 2). Count windows keep no clock and fire in the
// processing of the reading that completes them; the first firing has the
// two readings so far.
func ExampleSlidingCount() {
	job, err := window.Job(window.Spec[int64, acc]{
		Name:     "last-three",
		Assigner: window.SlidingCount(3, 2),
		Function: window.Aggregate[int64, acc, acc](meanOf{}, kstate.JSON[acc]()),
		Decode: func(rec *sluice.Record) (int64, error) {
			return strconv.ParseInt(string(rec.Value), 10, 64)
		},
		Encode: func(key []byte, w window.Window, a acc) ([]byte, error) {
			return fmt.Appendf(nil, "mean %.1f of %d", float64(a.Sum)/float64(a.N), a.N), nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = sluicetest.Run(func(t sluicetest.TB) {
		h := sluicetest.New(t, job, sluicetest.Options{})
		for _, v := range []string{"10", "20", "30", "40", "50", "60", "70"} {
			h.Send([]byte("s1"), []byte(v), time.Time{})
		}
		h.Settle()
		for _, r := range h.Output() {
			fmt.Printf("%s: %s\n", r.Key, r.Value)
		}
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// s1: mean 15.0 of 2
	// s1: mean 30.0 of 3
	// s1: mean 50.0 of 3
}

// acc and meanOf are ExampleSlidingCount's aggregation: count and sum.
type acc struct{ N, Sum int64 }

type meanOf struct{}

func (meanOf) CreateAccumulator() acc { return acc{} }
func (meanOf) Add(v int64, a acc) acc { return acc{a.N + 1, a.Sum + v} }
func (meanOf) Result(a acc) acc       { return a }
