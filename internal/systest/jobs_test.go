package systest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/tutorial"
	"github.com/sluicehq/sluice/jobs"
)

func sendReadings(t *testing.T, brokers string, readings []string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, r := range readings {
		id, _, _ := strings.Cut(r, ",")
		// One at a time: a sensor's readings keep their order.
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: input, Key: []byte(id), Value: []byte(r)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

func values(t *testing.T, brokers, topic string, n int) []string {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, topic, awaitIdle, check.Settled(n))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	slices.Sort(out)
	return out
}

func TestTemperatureAlertTutorial(t *testing.T) {
	brokers := newCluster(t, 2)
	o := options(brokers, "alert", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	o.Job = jobs.TemperatureAlert(10.0)
	startInProcess(t, o)
	sendReadings(t, brokers, tutorial.Readings)
	got := values(t, brokers, output, 3)
	want := tutorial.AlertValues()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("alerts:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestTemperatureSplitTutorial(t *testing.T) {
	brokers := newCluster(t, 2)
	o := options(brokers, "split", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	o.Job = jobs.TemperatureSplit()
	o.SideOutputTopics = map[sluice.OutputTag]string{jobs.LowTemperatures: "low"}
	startInProcess(t, o)
	sendReadings(t, brokers, append(slices.Clone(tutorial.Readings), "sensor_9,1547718211,not-a-number"))
	high := values(t, brokers, output, 5)
	low := values(t, brokers, "low", 5)
	var wantHigh, wantLow []string
	for _, r := range tutorial.Readings {
		if reading, _ := jobs.ParseReading([]byte(r)); reading.Temperature >= 30 {
			wantHigh = append(wantHigh, r)
		} else {
			wantLow = append(wantLow, r)
		}
	}
	slices.Sort(wantHigh)
	slices.Sort(wantLow)
	if !slices.Equal(high, wantHigh) || !slices.Equal(low, wantLow) {
		t.Fatalf("high %v, low %v; want high %v, low %v", high, low, wantHigh, wantLow)
	}
	if dlq := values(t, brokers, "split-dlq", 1); len(dlq) != 1 {
		t.Fatalf("dead letters %v, want the one unparsable reading", dlq)
	}
}

// A side output the job does not bind is refused before any I/O.
func TestUnboundSideOutputIsRefused(t *testing.T) {
	o := options("127.0.0.1:1", "split", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	o.Job = jobs.TemperatureSplit()
	if _, err := sluice.New(o); err == nil || !strings.Contains(err.Error(), `"low"`) {
		t.Fatalf("New with an unbound side output: %v", err)
	}
}

// rising readings, one partition so that one watermark covers them all
// (event time is per task). Base time 1547718200.
var risingReadings = []string{
	// sensor_1 rises at every reading for 10 s from its first rise (201):
	// its timer at 211 fires once the reading at 211 moves the watermark.
	"sensor_1,1547718200,20", "sensor_1,1547718201,21",
	"sensor_2,1547718202,20", "sensor_1,1547718203,22",
	// sensor_2's rises are broken by an equal reading, then by a fall.
	"sensor_2,1547718204,21", "sensor_2,1547718206,21", "sensor_1,1547718206,23",
	"sensor_2,1547718208,22", "sensor_3,1547718208,30", "sensor_3,1547718209,31",
	"sensor_1,1547718210,24", "sensor_1,1547718211,25",
	"sensor_2,1547718212,21",
	"sensor_3,1547718215,29", // a fall: sensor_3 never alerts
	// Late: behind the watermark (215), to the late side output.
	"sensor_4,1547718100,99",
	// sensor_8 rises from 250 to 261; sensor_9 moves the watermark to 300.
	// Its alert is the last, so reading two alerts proves no other came.
	"sensor_8,1547718250,1", "sensor_8,1547718251,2", "sensor_8,1547718261,3",
	"sensor_9,1547718300,0",
}

func TestRisingTemperatureEventTime(t *testing.T) {
	brokers := newCluster(t, 1)
	o := options(brokers, "rising", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	o.Job = jobs.RisingTemperature(jobs.RisingOptions{Window: 10 * time.Second, EventTime: true, LateOutput: true})
	o.SideOutputTopics = map[sluice.OutputTag]string{jobs.Late: "late"}
	startInProcess(t, o)
	sendReadings(t, brokers, risingReadings)
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, awaitIdle, check.Settled(2))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Key)+" "+string(r.Value))
	}
	want := []string{
		`sensor_1 {"id":"sensor_1","rising_for":"10s"}`,
		`sensor_8 {"id":"sensor_8","rising_for":"10s"}`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("alerts, in order:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if late := values(t, brokers, "late", 1); !slices.Equal(late, []string{"sensor_4,1547718100,99"}) {
		t.Fatalf("late side output %v", late)
	}
}
