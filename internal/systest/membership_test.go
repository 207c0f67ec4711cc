package systest

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestStaticMemberRestartsAndLeaves checks static membership under both
// group protocols with a session timeout far beyond the test, so nothing
// can wait it out (the rebalance timeout stays short: kfake's classic
// coordinator waits that long for a member killed during a rebalance): an instance killed with SIGKILL and restarted gets its
// partitions back at once (a classic JoinGroup replaces the dead member;
// under KIP-848 the restart ends the dead member's membership itself), and
// an instance stopped with SIGTERM leaves the group, so its partitions move
// to the other instance at once (KIP-848: a heartbeat with epoch -1, not
// the -2 that keeps them for a restart).
func TestStaticMemberRestartsAndLeaves(t *testing.T) {
	for i, proto := range protocols() {
		t.Run(proto, func(t *testing.T) {
			brokers := newCluster(t, 4)
			f := newFeeder(t, brokers, 40, uint64(40+i))
			app := "static-" + proto
			kids := make([]*child, 2)
			for j := range kids {
				kids[j] = newChild(t, brokers, app, fmt.Sprintf("i%d", j+1), t.TempDir(), "aggregate", sluice.ExactlyOnce,
					"SYSTEST_GROUP_PROTOCOL="+proto, "SYSTEST_SESSION=4m", "SYSTEST_REBALANCE=4s")
				kids[j].start()
			}
			step := func(what string) {
				t.Helper()
				f.produce(400, 0)
				if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
					for _, c := range kids {
						c.dumpLog()
					}
					t.Fatalf("%s: %v", what, rep)
				}
			}
			step("both running")

			kids[0].signal(syscall.SIGKILL)
			kids[0].wait(10 * time.Second)
			kids[0].start()
			step("after a SIGKILL and restart")

			kids[0].signal(syscall.SIGTERM)
			if !kids[0].wait(30 * time.Second) {
				kids[0].dumpLog()
				t.Fatal("i1 did not stop on SIGTERM")
			}
			step("after i1 left")
		})
	}
}
