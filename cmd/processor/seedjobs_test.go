package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/tutorial"
)

// The seed jobs as the binary runs them, configured by environment alone:
// rising-temperature in event time with a late side output,
// window-average with one, and temperature-alert on the tutorial's readings.
func TestSeedJobsFromTheEnvironment(t *testing.T) {
	tests := []struct {
		job      string
		env      map[string]string
		readings []string
		want     map[string][]string // topic → values, sorted
	}{
		{
			job: "rising-temperature",
			env: map[string]string{"SLUICE_TIME": "event", "SLUICE_SIDE_OUTPUT_TOPIC": "late"},
			readings: []string{
				"sensor_1,1547718200,20", "sensor_1,1547718201,21", "sensor_2,1547718202,20",
				"sensor_1,1547718205,22", "sensor_2,1547718206,21", "sensor_2,1547718207,21",
				"sensor_1,1547718209,23", "sensor_1,1547718211,24", "sensor_3,1547718100,5",
			},
			want: map[string][]string{
				"out":  {`{"id":"sensor_1","rising_for":"10s"}`},
				"late": {"sensor_3,1547718100,5"},
			},
		},
		{
			job: "window-average",
			env: map[string]string{"SLUICE_WINDOW": "10s", "SLUICE_SIDE_OUTPUT_TOPIC": "late"},
			// The tutorial's readings (docs/jobs.md): two windows fire, and
			// sensor_7's reading at 202 comes after its window did.
			readings: tutorial.Readings,
			want: map[string][]string{
				"out": {
					`{"id":"sensor_1","start":"2019-01-17T09:43:10Z","end":"2019-01-17T09:43:20Z","count":1,"mean":35.8}`,
					`{"id":"sensor_1","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":2,"mean":37.4}`,
					`{"id":"sensor_10","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":2,"mean":37.55}`,
					`{"id":"sensor_6","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":2,"mean":12.65}`,
					`{"id":"sensor_7","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":1,"mean":19.9}`,
				},
				"late": {"sensor_7,1547718202,30"},
			},
		},
		{
			job:      "temperature-alert",
			env:      map[string]string{},
			readings: tutorial.Readings,
			want:     map[string][]string{"out": tutorial.AlertValues()},
		},
	}
	for _, tt := range tests {
		t.Run(tt.job, func(t *testing.T) {
			// One partition: event time is per task.
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "temperatures"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			brokers := c.ListenAddrs()[0]
			env := map[string]string{
				"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": tt.job, "SLUICE_JOB": tt.job, "SLUICE_INSTANCE_ID": "i1",
				"SLUICE_INPUT_TOPICS": "temperatures", "SLUICE_OUTPUT_TOPIC": "out", "SLUICE_STATE_DIR": t.TempDir(),
				"SLUICE_METRICS_ADDR": freeAddr(t), "SLUICE_SESSION_TIMEOUT": "6s",
			}
			for k, v := range tt.env {
				env[k] = v
			}
			s := startServe(t, env)
			s.awaitReady(t)
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for _, r := range tt.readings {
				id, _, _ := strings.Cut(r, ",")
				if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "temperatures", Key: []byte(id), Value: []byte(r)}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			for topic, want := range tt.want {
				recs, err := check.ReadCommitted(context.Background(), []string{brokers}, topic, 20*time.Second, check.Settled(len(want)))
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, r := range recs {
					got = append(got, string(r.Value))
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("%s: %q, want %q", topic, got, want)
				}
			}
			s.stop(t)
		})
	}
}
