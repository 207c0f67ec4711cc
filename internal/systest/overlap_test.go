package systest

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// holdBound bounds each hold of holdForOverlap.
const holdBound = time.Second

// holdForOverlap makes a pipelined instance process records while an
// epoch commits, without relying on timing for the overlap: once the
// instance has ended afterEpochs transactions, a produce request that
// writes to neither the input nor the output topic (the barrier's epoch
// markers and changelog, which the epoch's flush waits for) is held at
// the broker, one at a time, until the instance fetched its input past
// where it stood when the hold began, that is, until a poll during the
// commit gave it records, which it processes before the commit can end.
// Every epoch is held so, until release, since a hold can also end
// without an overlap: the fetch that moves the input on may have been
// sent for a poll made before the hold began and reach the broker after
// (a CI run on a busy machine waited 60 s for the overlap when only the
// first epoch was held). A hold lasts at most holdBound: an instance that
// stops polling until the commit ends (the next epoch due meanwhile,
// which does not overlap) would otherwise wait for it for ever; the bound
// only keeps the instance going. release ends the hold in progress (the
// held instance may have crashed at an overlap) and any to come.
//
// A feeder that produces in bursts every interval otherwise lines its
// bursts up with the barriers: an epoch with no work does not end, so the
// barrier follows each burst, and the next burst comes after the flush
// (TestSinkCrashPoints' pipelined cases waited 60 s for an overlap that
// never came, twice).
func holdForOverlap(t *testing.T, c *kfake.Cluster, afterEpochs int32) (release func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	topics, err := kadm.NewClient(cl).ListTopics(context.Background(), input, output)
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}
	inID, outID := topics[input].ID, topics[output].ID

	var (
		mu      sync.Mutex
		fetched = map[int32]int64{} // the instance's last fetch offset of each input partition
		since   map[int32]int64     // fetched when the hold in progress began; nil: none
		moved   chan struct{}       // closed once the instance fetched past since
		ended   atomic.Int32
	)
	done := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(done) }) }
	t.Cleanup(release)
	c.ControlKey(int16(kmsg.EndTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		ended.Add(1)
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		mu.Lock()
		defer mu.Unlock()
		for _, rt := range req.Topics {
			if rt.Topic != input && rt.TopicID != inID {
				continue
			}
			for _, rp := range rt.Partitions {
				fetched[rp.Partition] = rp.FetchOffset
				if at, ok := since[rp.Partition]; ok && rp.FetchOffset > at {
					since = nil
					close(moved)
					return nil, nil, false
				}
			}
		}
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, rt := range kreq.(*kmsg.ProduceRequest).Topics {
			if rt.Topic == input || rt.Topic == output || rt.TopicID == inID || rt.TopicID == outID {
				return nil, nil, false
			}
		}
		if ended.Load() < afterEpochs {
			return nil, nil, false
		}
		select {
		case <-done:
			return nil, nil, false
		default:
		}
		mu.Lock()
		if since != nil { // the epoch's other requests go by
			mu.Unlock()
			return nil, nil, false
		}
		since = maps.Clone(fetched)
		held := make(chan struct{})
		moved = held
		mu.Unlock()
		c.SleepControl(func() { // the epoch's flush waits
			select {
			case <-held:
			case <-done:
			case <-time.After(holdBound):
			}
		})
		mu.Lock()
		if moved == held { // no other hold began since this one ended
			since = nil
		}
		mu.Unlock()
		return nil, nil, false
	})
	return release
}
