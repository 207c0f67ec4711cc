package systest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// TestSoak is `make soak`: the chaos run (SIGKILL with and without the
// state dir, SIGTERM, SIGSTOP past the session timeout, instances removed
// and added) for SYSTEST_SOAK (a Go duration), with broker faults mixed in
// by the in-process broker: EndTxn held past the transaction timeout,
// TxnOffsetCommit refused, produce answered NOT_LEADER_FOR_PARTITION,
// fetches held for seconds, coordinators moving. At the end a
// read_committed reader checks every input exactly once and that no
// transaction was left open. Not part of `make test`.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("SYSTEST_SOAK"))
	if err != nil || d <= 0 {
		t.Skip("set SYSTEST_SOAK to a duration (make soak SOAK=10m)")
	}
	seed := chaosSeed(t, uint64(time.Now().UnixNano()))
	t.Logf("soak for %v, seed %d (rerun with SYSTEST_CHAOS_SEED=%d)", d, seed, seed)
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(6, input, output), kip848Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	ch := &chaos{t: t, brokers: brokers, app: "soak", feeder: newFeeder(t, brokers, 200, seed)}
	for i := range 3 {
		state := filepath.Join(t.TempDir(), "state")
		id := fmt.Sprintf("i%d", i+1)
		ch.states = append(ch.states, state)
		ch.children = append(ch.children, newChild(t, brokers, ch.app, id, state, "aggregate", sluice.ExactlyOnce, "SYSTEST_INTERVAL=200ms"))
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var faults []string
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 7))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(2000+rng.IntN(4000)) * time.Millisecond): // fault pacing
			}
			name := injectFault(c, rng)
			mu.Lock()
			faults = append(faults, name)
			mu.Unlock()
		}
	}()
	ch.run(d, 50, seed)
	close(stop)
	wg.Wait()
	t.Logf("broker faults: %v", faults)
	rep := awaitAggregate(t, brokers, ch.feeder, 90*time.Second)
	if !rep.OK() {
		dumpMarkers(t, brokers, "soak")
		ch.dumpStuck()
		t.Fatalf("soak: %v", rep)
	}
	t.Logf("soak: %v over %v, %d broker faults", rep, d, len(faults))
	ch.shutdown()
}

// injectFault arms one broker fault, which fires on the next matching
// request, and names it.
func injectFault(c *kfake.Cluster, rng *rand.Rand) string {
	once := func(key kmsg.Key, fn func(kmsg.Request) (kmsg.Response, error, bool)) {
		var fired atomic.Bool
		c.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if !fired.CompareAndSwap(false, true) {
				return nil, nil, false
			}
			return fn(req)
		})
	}
	hold := func(d time.Duration) func(kmsg.Request) (kmsg.Response, error, bool) {
		return func(kmsg.Request) (kmsg.Response, error, bool) {
			c.SleepControl(func() { <-time.After(d) }) // the fault: a silent broker
			return nil, nil, false
		}
	}
	switch rng.IntN(6) {
	case 0:
		once(kmsg.EndTxn, hold(11*time.Second)) // past the 10s transaction timeout
		return "EndTxn held 11s"
	case 1:
		once(kmsg.TxnOffsetCommit, func(req kmsg.Request) (kmsg.Response, error, bool) {
			return check.TxnOffsetCommitError(req, kerr.IllegalGeneration), nil, true
		})
		return "TxnOffsetCommit ILLEGAL_GENERATION"
	case 2:
		once(kmsg.TxnOffsetCommit, func(req kmsg.Request) (kmsg.Response, error, bool) {
			return check.TxnOffsetCommitError(req, kerr.RebalanceInProgress), nil, true
		})
		return "TxnOffsetCommit REBALANCE_IN_PROGRESS"
	case 3:
		once(kmsg.Produce, func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			return check.ProduceError(kreq, kerr.NotLeaderForPartition), nil, true
		})
		return "produce NOT_LEADER_FOR_PARTITION"
	case 4:
		once(kmsg.Fetch, hold(3*time.Second))
		return "fetch held 3s"
	default:
		c.RehashCoordinators()
		return "coordinators moved"
	}
}
