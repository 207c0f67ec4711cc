package bench

import (
	"bytes"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/sluicetest"
)

// The raw-aggregate-alos contender does the aggregate job's work, so its
// outputs must be the job's: the same running aggregation per key, in the
// same bytes, for the same inputs.
func TestRawAggregateIsTheJob(t *testing.T) {
	h := sluicetest.New(t, jobs.Aggregate(), sluicetest.Options{})
	raw := rawAggregate()
	var want [][]byte
	for i := range 200 {
		key := []byte("k" + strconv.Itoa(i%7))
		value := []byte(strconv.Itoa((i*7919)%1000 - 500))
		h.Send(key, value, time.Time{})
		out, err := raw(&kgo.Record{Key: key, Value: value})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, out)
	}
	h.Settle()
	got := h.Output()
	if len(got) != len(want) {
		t.Fatalf("the job emitted %d outputs, want %d", len(got), len(want))
	}
	// The harness's single partition keeps the job's outputs in input
	// order.
	for i, r := range got {
		if !bytes.Equal(r.Value, want[i]) {
			t.Fatalf("output %d: the job emitted %s, rawAggregate %s", i, r.Value, want[i])
		}
	}
}
