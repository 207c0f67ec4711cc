package jobs_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/tutorial"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/sluicetest"
)

// The tutorial's readings in 10-second windows (docs/jobs.md walks through
// them): [190,200) fires when sensor_6's reading at 201 moves the
// watermark past it, [200,210) at sensor_6's 210, for each sensor in key
// order; sensor_7's reading at 202 then comes after its window fired and is
// late; [210,220) stays open.
func TestWindowAverage(t *testing.T) {
	t.Parallel()
	want := []string{
		`sensor_1 {"id":"sensor_1","start":"2019-01-17T09:43:10Z","end":"2019-01-17T09:43:20Z","count":1,"mean":35.8}`,
		`sensor_1 {"id":"sensor_1","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":2,"mean":37.4}`,
		`sensor_10 {"id":"sensor_10","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":2,"mean":37.55}`,
		`sensor_6 {"id":"sensor_6","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":2,"mean":12.65}`,
		`sensor_7 {"id":"sensor_7","start":"2019-01-17T09:43:20Z","end":"2019-01-17T09:43:30Z","count":1,"mean":19.9}`,
	}
	for _, lateOutput := range []bool{true, false} {
		h := sluicetest.New(t, jobs.WindowAverage(jobs.WindowAverageOptions{Window: 10 * time.Second, LateOutput: lateOutput}), sluicetest.Options{})
		send(t, h, tutorial.Readings...)
		h.Send([]byte("sensor_2"), []byte("sensor_1,1547718211,20"), time.Time{}) // keyed otherwise
		h.Settle()
		expect(t, "windows", h.Output(), want...)
		expect(t, "dead letters", h.DeadLetters(), "sensor_2 sensor_1,1547718211,20")
		if lateOutput {
			expect(t, "late", h.SideOutput(jobs.Late), "sensor_7 sensor_7,1547718202,30")
		}
	}
}
