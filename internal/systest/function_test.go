package systest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// pyFunction is the Python aggregate function (examples/function-python)
// beside one instance, as a sidecar container in the instance's pod: a
// process of its own on a unix socket, killed and restarted by the chaos.
type pyFunction struct {
	t      *testing.T
	sock   string
	log    string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

func newPyFunction(t *testing.T, id string) *pyFunction {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("python3 is needed for the sidecar tests (.ci/run installs it): %v", err)
	}
	dir := t.TempDir()
	return &pyFunction{t: t, sock: filepath.Join(dir, "fn.sock"), log: filepath.Join(dir, id+"-function.log")}
}

func (f *pyFunction) url() string { return "unix://" + f.sock }

func (f *pyFunction) start() {
	f.t.Helper()
	logf, err := os.OpenFile(f.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	cmd := exec.Command("python3", filepath.Join("..", "..", "examples", "function-python", "aggregate.py"))
	cmd.Env = append(os.Environ(), "FUNCTION_LISTEN=unix:"+f.sock, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	f.mu.Lock()
	f.cmd, f.exited = cmd, exited
	f.mu.Unlock()
	f.t.Cleanup(f.kill)
}

// kill is kill -9, and waits for the process to be gone.
func (f *pyFunction) kill() {
	f.mu.Lock()
	cmd, exited := f.cmd, f.exited
	f.cmd = nil
	f.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

func (f *pyFunction) dumpLog() {
	b, _ := os.ReadFile(f.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	f.t.Logf("log of %s:\n%s", filepath.Base(f.log), b)
}

// The aggregate computed by a Python function (sidecar mode) under the
// core's chaos (kill -9, SIGTERM, SIGSTOP past the session timeout, scaling
// down and up) plus kill -9 of the functions themselves: the output read
// read_committed has no duplicate, no loss and no wrong value.
func TestChaosPythonFunctionAggregate(t *testing.T) {
	seed := chaosSeed(t, 24)
	proto := chaosProtocol("classic")
	brokers := newCluster(t, 6)
	ch := &chaos{t: t, brokers: brokers, app: "chaos-function", feeder: newFeeder(t, brokers, 200, seed)}
	var fns []*pyFunction
	for i := range 3 {
		id := fmt.Sprintf("i%d", i+1)
		fn := newPyFunction(t, id)
		fn.start()
		fns = append(fns, fn)
		state := filepath.Join(t.TempDir(), "state")
		ch.states = append(ch.states, state)
		ch.children = append(ch.children, newChild(t, brokers, ch.app, id, state, "function", sluice.ExactlyOnce,
			"SYSTEST_INTERVAL=200ms", "SYSTEST_GROUP_PROTOCOL="+proto, "SYSTEST_FUNCTION_URL="+fn.url()))
	}
	dump := func(chDump func()) {
		chDump()
		for _, fn := range fns {
			fn.dumpLog()
		}
	}

	// The functions' own chaos, beside the instances': kill -9 one, and
	// start it again a moment later.
	stop := make(chan struct{})
	done := make(chan struct{})
	var killed []string
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(seed, 7))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(700+rng.IntN(1500)) * time.Millisecond): // chaos pacing
			}
			i := rng.IntN(len(fns))
			fns[i].kill()
			killed = append(killed, fmt.Sprintf("i%d", i+1))
			<-time.After(time.Duration(100+rng.IntN(900)) * time.Millisecond)
			fns[i].start()
		}
	}()
	ch.run(20*time.Second, 0, seed)
	close(stop)
	<-done
	t.Logf("functions killed with -9: %s", strings.Join(killed, " "))
	if len(killed) == 0 {
		t.Fatal("no function was killed")
	}

	// The kills were noticed: some batch waited for its function.
	waited := 0
	for _, c := range ch.children {
		b, _ := os.ReadFile(c.log)
		waited += strings.Count(string(b), "job's service unavailable")
	}
	t.Logf("batches that waited for their function: %d", waited)
	if waited == 0 {
		dump(ch.dumpLogs)
		t.Fatal("no instance ever found its function unavailable: the function kills were not exercised")
	}

	rep := awaitAggregate(t, brokers, ch.feeder, awaitIdle)
	if !rep.OK() {
		dump(ch.dumpStuck)
		t.Fatalf("aggregate through the Python function under chaos: %v", rep)
	}
	t.Logf("aggregate through the Python function under chaos: %v", rep)
	ch.shutdown()
}
