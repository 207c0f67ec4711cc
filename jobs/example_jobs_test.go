package jobs_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/sluicetest"
)

// header is the value of a record's header, "" when it has none.
func header(r sluice.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// The running count, sum, min and max per key; a value that is not a
// number goes to the dead-letter topic, which names the stage that failed.
func ExampleAggregate() {
	err := sluicetest.Run(func(t sluicetest.TB) {
		h := sluicetest.New(t, jobs.Aggregate(), sluicetest.Options{})
		for _, v := range []string{"5", "12", "many", "-3"} {
			h.Send([]byte("sensor-1"), []byte(v), time.Time{})
		}
		h.Settle()
		for _, r := range h.Output() {
			fmt.Printf("%s %s\n", r.Key, r.Value)
		}
		for _, r := range h.DeadLetters() {
			fmt.Printf("dead letter %q: stage %s\n", r.Value, header(r, sluice.HeaderStage))
		}
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// sensor-1 {"count":1,"sum":5,"min":5,"max":5}
	// sensor-1 {"count":2,"sum":17,"min":5,"max":12}
	// sensor-1 {"count":3,"sum":14,"min":-3,"max":12}
	// dead letter "many": stage decode
}

// Readings of 30 degrees or more go to the output topic, the others to the
// side output jobs.LowTemperatures, in the same transaction.
func ExampleTemperatureSplit() {
	err := sluicetest.Run(func(t sluicetest.TB) {
		h := sluicetest.New(t, jobs.TemperatureSplit(), sluicetest.Options{})
		for _, v := range []string{"s1,1700000000,31.5", "s2,1700000001,12.0", "s1,1700000002,29.9"} {
			r, _ := jobs.ParseReading([]byte(v))
			h.Send([]byte(r.ID), []byte(v), time.Unix(r.Seconds, 0))
		}
		h.Settle()
		for _, r := range h.Output() {
			fmt.Printf("output %s\n", r.Value)
		}
		for _, r := range h.SideOutput(jobs.LowTemperatures) {
			fmt.Printf("low    %s\n", r.Value)
		}
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// output s1,1700000000,31.5
	// low    s2,1700000001,12.0
	// low    s1,1700000002,29.9
}

// A sensor whose temperature rose at every reading for the window alerts
// once its processing-time timer fires; a fall disarms it.
func ExampleRisingTemperature() {
	err := sluicetest.Run(func(t sluicetest.TB) {
		job := jobs.RisingTemperature(jobs.RisingOptions{Window: 10 * time.Second})
		h := sluicetest.New(t, job, sluicetest.Options{})
		for _, v := range []string{"s1,0,20", "s1,1,21", "s2,2,20", "s2,3,22", "s2,4,19"} {
			r, _ := jobs.ParseReading([]byte(v))
			h.Send([]byte(r.ID), []byte(v), time.Time{})
		}
		h.Settle()
		h.Advance(10 * time.Second)
		h.Settle()
		for _, r := range h.Output() {
			fmt.Printf("%s\n", r.Value)
		}
	})
	if err != nil {
		fmt.Println(err)
	}
	// Output:
	// {"id":"s1","rising_for":"10s"}
}

func ExampleParseReading() {
	r, err := jobs.ParseReading([]byte("sensor_1,1547718199,35.8"))
	fmt.Println(r.ID, time.Unix(r.Seconds, 0).UTC().Format(time.RFC3339), r.Temperature, err)
	_, err = jobs.ParseReading([]byte("sensor_1,yesterday,35.8"))
	fmt.Println(err)
	// Output:
	// sensor_1 2019-01-17T09:43:19Z 35.8 <nil>
	// reading "sensor_1,yesterday,35.8": epoch seconds: strconv.ParseInt: parsing "yesterday": invalid syntax
}
