package systest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
)

// dumpMarkers logs the last epoch markers of every changelog partition as
// a read_committed reader without control records sees them, and the
// group's committed offsets: evidence for a failed exactly-once check.
func dumpMarkers(t *testing.T, brokers, app string, keepControl bool) {
	opts := []kgo.Opt{kgo.SeedBrokers(brokers), kgo.ConsumeTopics(changelog.TopicName(app)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted())}
	if keepControl {
		opts = append(opts, kgo.KeepControlRecords())
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	last := map[int32][]string{}
	idle := time.Now()
	for time.Since(idle) < 2*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			idle = time.Now()
			if !changelog.IsMarker(r.Key) {
				return
			}
			m, _ := changelog.DecodeMarker(r.Value)
			s := last[r.Partition]
			s = append(s, time.Now().Format("")+" off="+itoa(r.Offset)+" next="+itoa(m.Offsets[input]))
			if len(s) > 3 {
				s = s[1:]
			}
			last[r.Partition] = s
		})
	}
	t.Logf("last markers (keepControl=%v): %v", keepControl, last)
	offs, err := kadm.NewClient(cl).FetchOffsets(context.Background(), app)
	if err == nil {
		t.Logf("group offsets: %v", offs)
	}
}

func itoa(v int64) string { return time.Duration(v).String() }
