package systest

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
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
//
// With pipelined epochs, the crashes before and after EndTxn come while the
// next epoch's records are processed and held (pipelined.go).
func TestCrashPoints(t *testing.T) {
	tests := []struct {
		name      string
		point     string
		loseState bool
		pipelined bool
	}{
		{"before pre-commit", sluice.PointBeforePreCommit, false, false},
		{"before commit", sluice.PointBeforeCommit, false, false},
		{"after commit before apply", sluice.PointAfterCommit, false, false},
		{"after apply", sluice.PointAfterApply, false, false},
		{"after commit, state dir lost", sluice.PointAfterCommit, true, false},
		{"before commit, pipelined epochs", sluice.PointBeforeCommit, false, true},
		{"after commit before apply, pipelined epochs", sluice.PointAfterCommit, false, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			brokers := newCluster(t, 3)
			f := newFeeder(t, brokers, 40, uint64(10+i))
			state := t.TempDir()
			c := newChild(t, brokers, "crash", "i1", state, "aggregate", sluice.ExactlyOnce, fmt.Sprintf("SYSTEST_PIPELINED=%v", tt.pipelined))
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
			rep := awaitAggregate(t, brokers, f, awaitIdle)
			if !rep.OK() {
				c.dumpLog()
				t.Fatalf("after crash %s: %v", tt.name, rep)
			}
			t.Logf("%s: %v", tt.name, rep)
		})
	}
}

// TestPausePastTransactionTimeout stops an instance with SIGSTOP for longer
// than both the session timeout (6s) and the transaction timeout (10s). The
// broker aborts its open transaction and its partitions move; when it
// resumes, its session is fenced, and it must rebuild it and carry on
// without duplicating or losing anything.
func TestPausePastTransactionTimeout(t *testing.T) {
	brokers := newCluster(t, 4)
	f := newFeeder(t, brokers, 50, 31)
	a := newChild(t, brokers, "pause", "a", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	b := newChild(t, brokers, "pause", "b", t.TempDir(), "aggregate", sluice.ExactlyOnce)
	a.start()
	b.start()
	f.produce(500, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatalf("before the pause: %v", rep)
	}
	a.signal(syscall.SIGSTOP)
	// Input keeps arriving while a is frozen mid-epoch.
	stopAt := time.Now().Add(12 * time.Second)
	for time.Now().Before(stopAt) {
		f.produce(50, 0)
		a.wait(200 * time.Millisecond) // paces the feed; a cannot exit while stopped
	}
	a.signal(syscall.SIGCONT)
	for range 10 {
		f.produce(50, 0)
	}
	rep := awaitAggregate(t, brokers, f, awaitIdle)
	if !rep.OK() {
		a.dumpLog()
		b.dumpLog()
		t.Fatalf("after a pause past the transaction timeout: %v", rep)
	}
	if !a.running() || !b.running() {
		a.dumpLog()
		t.Fatal("an instance exited")
	}
	t.Logf("pause past the transaction timeout: %v", rep)
}
