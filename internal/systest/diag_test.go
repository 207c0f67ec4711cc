package systest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
)

// dumpMarkers logs, as evidence for a failed exactly-once check, the last
// epoch markers of every changelog partition as a read_committed reader
// sees them, next to the group's committed offsets: the two must agree.
func dumpMarkers(t *testing.T, brokers, app string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(changelog.TopicName(app)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
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
			s := append(last[r.Partition], fmt.Sprintf("marker@%d epoch %d next %v", r.Offset, m.Epoch, m.Offsets))
			if len(s) > 3 {
				s = s[1:]
			}
			last[r.Partition] = s
		})
	}
	t.Logf("last markers per changelog partition: %v", last)
	if offs, err := kadm.NewClient(cl).FetchOffsets(context.Background(), app); err == nil {
		offs.Each(func(o kadm.OffsetResponse) { t.Logf("group offset %s/%d = %d", o.Topic, o.Partition, o.At) })
	}
}
