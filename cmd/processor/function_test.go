package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
)

// pyFunction runs Python code (with function/python on its path) as the
// function beside a processor, on a unix socket, and waits until it
// listens.
type pyFunction struct {
	t    *testing.T
	sock string
	code string
	cmd  *exec.Cmd
	log  *lockedBuffer
}

func newPyFunction(t *testing.T, code string) *pyFunction {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("python3 is needed for the sidecar tests (.ci/run installs it): %v", err)
	}
	return &pyFunction{t: t, sock: filepath.Join(t.TempDir(), "fn.sock"), code: code}
}

// pyAggregate is the Python example aggregate function.
const pyAggregate = "import runpy; runpy.run_path('../../examples/function-python/aggregate.py', run_name='__main__')"

func (f *pyFunction) url() string { return "unix://" + f.sock }

func (f *pyFunction) start() {
	f.t.Helper()
	os.Remove(f.sock)
	f.cmd = exec.Command("python3", "-c", "import sys; sys.path.insert(0, '../../function/python')\n"+f.code)
	f.cmd.Env = append(os.Environ(), "FUNCTION_LISTEN=unix:"+f.sock, "PYTHONDONTWRITEBYTECODE=1")
	f.log = &lockedBuffer{}
	f.cmd.Stdout, f.cmd.Stderr = f.log, f.log
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := f.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	cmd := f.cmd
	f.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(f.log.String(), "listening") {
		if time.Now().After(deadline) {
			f.t.Fatalf("the function does not listen after 30s:\n%s", f.log.String())
		}
		<-time.After(10 * time.Millisecond)
	}
}

func (f *pyFunction) kill() {
	f.cmd.Process.Signal(syscall.SIGKILL)
	f.cmd.Wait()
}

// A function the processor cannot run with stops it at start with status 2
// and one line naming the variable.
func TestFunctionDescribeMismatchExitsTwo(t *testing.T) {
	for _, tt := range []struct {
		name, code, variable, says string
	}{
		{"protocol version", "import sluice_function as sf\nsf.PROTOCOL_VERSION = 2\nsf.serve(lambda c: sf.Result())",
			"SLUICE_FUNCTION_URL", "protocol version 2 is not supported"},
		{"unbound side output", "import sluice_function as sf\nsf.serve(lambda c: sf.Result(), side_outputs=['low'])",
			"SLUICE_SIDE_OUTPUT_TOPIC", `the function declares side output "low"`},
		{"state declared twice", "import sluice_function as sf\nsf.serve(lambda c: sf.Result(), states=[sf.State('a'), sf.State('a')])",
			"SLUICE_FUNCTION_URL", `state "a" is declared twice`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fn := newPyFunction(t, tt.code)
			fn.start()
			cmd := exec.Command(binary)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"),
				"SLUICE_BROKERS=127.0.0.1:1", "SLUICE_APP_ID=app", "SLUICE_JOB=function", "SLUICE_FUNCTION_URL=" + fn.url(),
				"SLUICE_INPUT_TOPICS=in", "SLUICE_OUTPUT_TOPIC=out", "SLUICE_INSTANCE_ID=i1",
				"SLUICE_STATE_DIR=" + t.TempDir(), "SLUICE_METRICS_ADDR=127.0.0.1:0",
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; stderr: %s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "processor: "+tt.variable) || !strings.Contains(lines[0], tt.says) {
				t.Fatalf("stderr %q: want one line naming %s and saying %q", stderr.String(), tt.variable, tt.says)
			}
		})
	}
}

// The binary in sidecar mode: started before its function it serves
// /healthz but not /readyz until the function answers; the Python aggregate
// beside it is then killed with -9 mid-run. While it is gone the processor stays up and answers /readyz
// 503; once it is back the processor is ready again, and the output is
// exactly once.
func TestFunctionEndToEndWithTheFunctionKilled(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	fn := newPyFunction(t, pyAggregate)
	p := newProc(t, brokers, "a")
	p.env = append(p.env, "SLUICE_JOB=function", "SLUICE_FUNCTION_URL="+fn.url())
	p.start()
	// Before its function listens the processor is alive, not ready.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.log.String(), "function does not answer Describe yet") {
		if time.Now().After(deadline) {
			t.Fatalf("the processor does not wait for its function; log:\n%s", p.log.String())
		}
		<-time.After(20 * time.Millisecond)
	}
	if code, _ := p.get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while the function is awaited: %d, want 200", code)
	}
	if code, _ := p.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while the function is awaited: %d, want 503", code)
	}
	fn.start()
	p.awaitReady()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	inputs := map[string][]int64{}
	n := 0
	send := func(count int) {
		var recs []*kgo.Record
		for range count {
			n++
			key := "k" + strconv.Itoa(n%23)
			inputs[key] = append(inputs[key], int64(n))
			recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(strconv.Itoa(n))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	send(500)
	fn.kill()
	send(500)
	deadline = time.Now().Add(30 * time.Second)
	for {
		if code, _ := p.get("/readyz"); code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 503 with the function gone; log:\n%s", p.log.String())
		}
		<-time.After(20 * time.Millisecond)
	}
	if code, _ := p.get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz with the function gone: %d, want 200 (the processor is alive)", code)
	}
	fn.start()
	send(500)
	p.awaitReady()

	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, "out", 30*time.Second, check.Settled(n))
	if err != nil {
		t.Fatal(err)
	}
	if rep := check.Aggregate(inputs, recs); !rep.OK() || rep.Inputs != n {
		t.Fatalf("output: %v; log:\n%s", rep, p.log.String())
	}
	if _, body := p.get("/metrics"); !strings.Contains(body, `sluice_function_calls_total{result="ok"}`) || !strings.Contains(body, "sluice_function_batch_records_count") {
		t.Fatalf("/metrics lacks the function series:\n%.2000s", body)
	}
	if err := p.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v; log:\n%s", err, p.log.String())
	}
}
