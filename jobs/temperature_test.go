package jobs_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/tutorial"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/sluicetest"
)

// send sends readings keyed by sensor id, each with its CSV seconds as
// its Kafka timestamp.
func send(t *testing.T, h *sluicetest.Harness, readings ...string) {
	t.Helper()
	for _, v := range readings {
		r, err := jobs.ParseReading([]byte(v))
		if err != nil {
			t.Fatal(err)
		}
		h.Send([]byte(r.ID), []byte(v), time.Unix(r.Seconds, 0))
	}
}

// keyed renders records as "key value", in the order read.
func keyed(recs []sluice.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, fmt.Sprintf("%s %s", r.Key, r.Value))
	}
	return out
}

func expect(t *testing.T, what string, got []sluice.Record, want ...string) {
	t.Helper()
	if g := keyed(got); !slices.Equal(g, want) {
		t.Fatalf("%s:\n%s\nwant\n%s", what, strings.Join(g, "\n"), strings.Join(want, "\n"))
	}
}

func TestTemperatureAlert(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, jobs.TemperatureAlert(10.0), sluicetest.Options{})
	send(t, h, tutorial.Readings...)
	h.Settle()
	var want []string
	for _, a := range tutorial.Alerts {
		want = append(want, a.ID+" "+a.Value)
	}
	expect(t, "alerts", h.Output(), want...)
}

func TestTemperatureSplit(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, jobs.TemperatureSplit(), sluicetest.Options{})
	send(t, h, tutorial.Readings...)
	h.Send([]byte("sensor_9"), []byte("sensor_9,1547718211,hot"), time.Time{})
	h.Settle()
	var high, low []string
	for _, v := range tutorial.Readings {
		id, _, _ := strings.Cut(v, ",")
		if r, _ := jobs.ParseReading([]byte(v)); r.Temperature >= 30 {
			high = append(high, id+" "+v)
		} else {
			low = append(low, id+" "+v)
		}
	}
	expect(t, "output (high)", h.Output(), high...)
	expect(t, "side output (low)", h.SideOutput(jobs.LowTemperatures), low...)
	expect(t, "dead letters", h.DeadLetters(), "sensor_9 sensor_9,1547718211,hot")
}

// In processing time the window runs on the clock: readings that rise for
// 10 s of processing time alert once; a fall or an equal reading before
// then disarms the sensor.
func TestRisingTemperatureProcessingTime(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, jobs.RisingTemperature(jobs.RisingOptions{Window: 10 * time.Second}), sluicetest.Options{Partitions: 2})
	// The CSV seconds do not matter in processing time.
	send(t, h, "sensor_1,0,20", "sensor_2,0,20", "sensor_3,0,20")
	send(t, h, "sensor_1,0,21", "sensor_2,0,21", "sensor_3,0,21") // every sensor arms for now+10s
	h.Settle()
	h.Advance(5 * time.Second)
	send(t, h, "sensor_1,0,22", "sensor_2,0,19", "sensor_3,0,21") // a rise, a fall, an equal reading
	h.Settle()
	h.Advance(4*time.Second + 999*time.Millisecond)
	h.Settle()
	expect(t, "alerts 1 ms before the window ends", h.Output())
	h.Advance(time.Millisecond)
	h.Settle()
	want := `sensor_1 {"id":"sensor_1","rising_for":"10s"}`
	expect(t, "alerts when the window ends", h.Output(), want)
	h.Advance(time.Minute)
	h.Settle()
	expect(t, "alerts a minute later", h.Output(), want)
}

// In event time the window runs on the readings' own seconds: a sensor that
// rises at every step for 10 s of event time alerts once, when a later
// record moves the watermark past its timer; one whose rise is broken by a
// fall or an equal reading before then never alerts. One partition, so one
// watermark covers every sensor.
func TestRisingTemperatureEventTime(t *testing.T) {
	t.Parallel()
	h := sluicetest.New(t, jobs.RisingTemperature(jobs.RisingOptions{Window: 10 * time.Second, EventTime: true}), sluicetest.Options{})
	send(t, h,
		// sensor_1 rises at every reading from 201: its timer is at 211.
		"sensor_1,1547718200,20", "sensor_1,1547718201,21",
		"sensor_2,1547718202,20", "sensor_1,1547718203,22",
		// sensor_2's rises are broken by an equal reading, then by a fall.
		"sensor_2,1547718204,21", "sensor_2,1547718206,21", "sensor_1,1547718206,23",
		"sensor_2,1547718208,22", "sensor_3,1547718208,30", "sensor_3,1547718209,31",
		"sensor_1,1547718210,24",
	)
	h.Settle()
	expect(t, "alerts with the watermark at 210", h.Output())
	send(t, h, "sensor_2,1547718212,21") // moves the watermark past 211
	h.Settle()
	want := `sensor_1 {"id":"sensor_1","rising_for":"10s"}`
	expect(t, "alerts with the watermark at 212", h.Output(), want)
	send(t, h,
		"sensor_3,1547718215,29", // a fall: sensor_3's timer at 219 goes
		"sensor_9,1547718300,0",  // moves the watermark past every timer
	)
	h.Settle()
	expect(t, "alerts with the watermark at 300", h.Output(), want)
}
