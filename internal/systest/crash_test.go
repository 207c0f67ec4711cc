package systest

import (
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
)

// TestCrashPoints kills a real instance process at each step of the epoch
// protocol (DESIGN §3's crash table) and checks that, after a restart, a
// read_committed reader sees every input reflected exactly once.
//
//	crash point                  after restart
//	before pre-commit            transaction aborted (fenced by the restart); backend at E-1
//	after pre-commit, pre-EndTxn same
//	after EndTxn, before apply   backend at E-1, changelog at E: the tail is replayed
//	after apply                  backend at E
//	state dir lost               full restore from the changelog
func TestCrashPoints(t *testing.T) {
	tests := []struct {
		name      string
		point     string
		loseState bool
	}{
		{"before pre-commit", engine.PointBeforePreCommit, false},
		{"before commit", engine.PointBeforeCommit, false},
		{"after commit before apply", engine.PointAfterCommit, false},
		{"after apply", engine.PointAfterApply, false},
		{"after commit, state dir lost", engine.PointAfterCommit, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t, 3)
			f := newFeeder(t, brokers, 40, uint64(10+i))
			state := t.TempDir()
			c := newChild(t, brokers, "crash", "i1", state, "aggregate", engine.ExactlyOnce)
			c.start("SYSTEST_CRASH_AT="+tt.point, "SYSTEST_CRASH_AFTER=3")
			deadline := time.Now().Add(60 * time.Second)
			for c.running() {
				if time.Now().After(deadline) {
					c.dumpLog()
					t.Fatalf("instance did not reach %s", tt.point)
				}
				f.produce(50, 40)
				c.wait(100 * time.Millisecond)
			}
			if tt.loseState {
				if err := os.RemoveAll(state); err != nil {
					t.Fatal(err)
				}
			}
			c.start()
			f.produce(300, 40)
			rep := awaitAggregate(t, brokers, f, 30*time.Second)
			if !rep.OK() {
				c.dumpLog()
				t.Fatalf("after crash %s: %v", tt.name, rep)
			}
			t.Logf("%s: %v", tt.name, rep)
		})
	}
}
