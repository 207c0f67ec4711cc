package jobs

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/window"
)

// WindowAverageOptions parameterise WindowAverage.
type WindowAverageOptions struct {
	// Window is the length of the tumbling event-time windows; 0 means a
	// minute.
	Window time.Duration
	// LateOutput sends readings whose window has already fired to the side
	// output Late, unchanged; otherwise they are dropped and counted (the
	// job's state window-average.late-dropped, per sensor).
	LateOutput bool
}

// WindowMean is window-average's output: one per sensor and window.
type WindowMean struct {
	ID    string  `json:"id"`
	Start string  `json:"start"` // RFC 3339, UTC
	End   string  `json:"end"`   // RFC 3339, UTC, exclusive
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
}

// meanAcc is window-average's accumulator: count and sum of the window's
// temperatures.
type meanAcc struct {
	Count int64
	Sum   float64
}

// mean is the AggregateFunc of window-average (with Merge, though tumbling
// windows never merge).
type mean struct{}

func (mean) CreateAccumulator() meanAcc { return meanAcc{} }
func (mean) Add(r Reading, a meanAcc) meanAcc {
	return meanAcc{a.Count + 1, a.Sum + r.Temperature}
}
func (mean) Result(a meanAcc) meanAcc { return a }
func (mean) Merge(a, b meanAcc) meanAcc {
	return meanAcc{a.Count + b.Count, a.Sum + b.Sum}
}

// meanAccCodec stores the accumulator in 16 bytes: the count and the
// float64 bits of the sum, big-endian. It is read and written for every
// reading, so it avoids JSON.
type meanAccCodec struct{}

func (meanAccCodec) Encode(a meanAcc) ([]byte, error) {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(a.Count))
	return binary.BigEndian.AppendUint64(b, math.Float64bits(a.Sum)), nil
}

func (meanAccCodec) Decode(b []byte) (meanAcc, error) {
	if len(b) != 16 {
		return meanAcc{}, fmt.Errorf("window-average accumulator: %d bytes, want 16", len(b))
	}
	return meanAcc{int64(binary.BigEndian.Uint64(b)), math.Float64frombits(binary.BigEndian.Uint64(b[8:]))}, nil
}

// WindowAverage emits, per sensor and tumbling window of o.Window in event
// time (the CSV's seconds; the watermark is the largest time seen minus the
// instance's out-of-orderness), the mean temperature of its readings:
// {"id":…,"start":…,"end":…,"count":N,"mean":X} keyed by the sensor id,
// when the watermark reaches the window's end. A reading whose window has
// fired is late: see WindowAverageOptions.LateOutput. The input must be
// keyed by sensor id (window state and timers belong to the record key); a
// record keyed otherwise, or whose value does not parse, goes to the
// dead-letter topic.
func WindowAverage(o WindowAverageOptions) sluice.Job {
	if o.Window == 0 {
		o.Window = time.Minute
	}
	spec := window.Spec[Reading, meanAcc]{
		Name:     "window-average",
		Assigner: window.TumblingEventTime(o.Window),
		Function: window.Aggregate[Reading, meanAcc, meanAcc](mean{}, meanAccCodec{}),
		Decode: func(rec *sluice.Record) (Reading, error) {
			r, err := ParseReading(rec.Value)
			if err != nil {
				return Reading{}, &sluice.DecodeError{Err: err}
			}
			if string(rec.Key) != r.ID {
				return Reading{}, fmt.Errorf("window-average needs its input keyed by sensor id: key %q, sensor %q", rec.Key, r.ID)
			}
			return r, nil
		},
		Timestamp: readingTime,
		Encode: func(key []byte, w window.Window, a meanAcc) ([]byte, error) {
			return json.Marshal(WindowMean{
				ID:    string(key),
				Start: w.Start.Format(time.RFC3339),
				End:   w.End.Format(time.RFC3339),
				Count: a.Count,
				Mean:  a.Sum / float64(a.Count),
			})
		},
	}
	if o.LateOutput {
		spec.LateOutput = Late
	}
	job, err := window.Job(spec)
	if err != nil {
		// Only a window shorter than a millisecond gets here, which the
		// processor's configuration refuses.
		panic(fmt.Sprintf("jobs: window-average: %v", err))
	}
	return job
}

// readingTime is a reading's event time: its CSV seconds.
func readingTime(rec *sluice.Record) (time.Time, error) {
	r, err := ParseReading(rec.Value)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(r.Seconds, 0), nil
}
