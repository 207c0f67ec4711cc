package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
)

// binary is the processor built once for the tests that run it as a
// separate process, the way operators and the acceptance checks do.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "processor-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "processor")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build processor:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestBadEnvironmentExitsTwoWithOneLine(t *testing.T) {
	good := []string{
		"SLUICE_BROKERS=127.0.0.1:1", "SLUICE_APP_ID=app", "SLUICE_JOB=aggregate",
		"SLUICE_INPUT_TOPICS=in", "SLUICE_OUTPUT_TOPIC=out", "SLUICE_INSTANCE_ID=i1",
	}
	without := func(name string) []string {
		var out []string
		for _, kv := range good {
			if !strings.HasPrefix(kv, name+"=") {
				out = append(out, kv)
			}
		}
		return out
	}
	tests := []struct {
		name, variable string
		env            []string
	}{
		{"missing app id", "SLUICE_APP_ID", without("SLUICE_APP_ID")},
		{"checkpoint interval not a duration", "SLUICE_CHECKPOINT_INTERVAL", append(good, "SLUICE_CHECKPOINT_INTERVAL=fast")},
		{"unknown job", "SLUICE_JOB", append(without("SLUICE_JOB"), "SLUICE_JOB=nosuchjob")},
		{"missing brokers", "SLUICE_BROKERS", without("SLUICE_BROKERS")},
		{"bad guarantee", "SLUICE_GUARANTEE", append(good, "SLUICE_GUARANTEE=maybe_once")},
		{"memory limit ratio out of range", "AUTOMEMLIMIT", append(good, "AUTOMEMLIMIT=1.5")},
		{"peer URL without the instance", "SLUICE_QUERY_PEER_URL", append(good, "SLUICE_QUERY_PEER_URL=http://sluice:9090")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(binary)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tt.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			exit, ok := err.(*exec.ExitError)
			if !ok || exit.ExitCode() != 2 {
				t.Fatalf("exit: %v, want status 2; stderr: %s", err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tt.variable) {
				t.Fatalf("stderr %q: want one line naming %s", stderr.String(), tt.variable)
			}
		})
	}
}

type proc struct {
	t       *testing.T
	env     []string
	metrics string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	err     error         // cmd's exit, once exited is closed
	log     *lockedBuffer
}

// lockedBuffer is a process's stderr, written by exec's copying goroutine
// while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// freeAddr is a loopback address with a port that nothing listens on,
// for a processor process to listen on. The port is closed again before
// the process binds it, so it is drawn below the kernel's ephemeral range
// (ip_local_port_range): the ports that ":0" hands out are also what every
// outgoing connection, a Kafka client's among them, is given, and one
// could take the port in between. A port drawn here is taken only by
// another test drawing the same one in the same moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	lo, hi := 10000, ephemeralLow()
	for range 1000 {
		if hi-lo < 1000 {
			break // no room below the ephemeral range: fall back to ":0"
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+rand.IntN(hi-lo)))
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768, its default, elsewhere).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

func newProc(t *testing.T, brokers, id string) *proc {
	metrics := freeAddr(t)
	return &proc{t: t, metrics: metrics, env: []string{
		"PATH=" + os.Getenv("PATH"),
		"SLUICE_BROKERS=" + brokers, "SLUICE_APP_ID=e2e", "SLUICE_JOB=aggregate",
		"SLUICE_INPUT_TOPICS=in", "SLUICE_OUTPUT_TOPIC=out", "SLUICE_INSTANCE_ID=" + id,
		"SLUICE_STATE_DIR=" + filepath.Join(t.TempDir(), "state"), "SLUICE_METRICS_ADDR=" + metrics,
		"SLUICE_CHECKPOINT_INTERVAL=200ms", "SLUICE_SESSION_TIMEOUT=6s",
	}}
}

func (p *proc) start() {
	p.cmd = exec.Command(binary)
	p.cmd.Env = p.env
	p.log = &lockedBuffer{}
	p.cmd.Stderr = p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	cmd, exited := p.cmd, make(chan struct{})
	p.exited = exited
	go func() {
		p.err = cmd.Wait()
		close(exited)
	}()
	p.t.Cleanup(func() { cmd.Process.Kill(); <-exited })
}

func (p *proc) stop(sig syscall.Signal) error {
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no exit 30s after %v", sig)
	}
}

func (p *proc) get(path string) (int, string) {
	resp, err := http.Get("http://" + p.metrics + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// awaitReady polls /readyz until it answers 200 (a condition with a
// deadline, not a sleep standing in for one).
func (p *proc) awaitReady() {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _ := p.get("/readyz"); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("not ready after 30s; log:\n%s", p.log.String())
		}
		<-time.After(50 * time.Millisecond)
	}
}

// The binary end to end: two instances, kill -9 and restart of one, then
// SIGTERM of both; the output is exactly once, metrics and health answer,
// and no transaction is left open.
func TestProcessorEndToEnd(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()[0]
	a, b := newProc(t, brokers, "a"), newProc(t, brokers, "b")
	a.start()
	b.start()
	a.awaitReady()
	b.awaitReady()

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
			key := "k" + strconv.Itoa(n%37)
			inputs[key] = append(inputs[key], int64(n))
			recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(strconv.Itoa(n))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	send(1000)
	if err := a.stop(syscall.SIGKILL); err == nil {
		t.Fatal("kill -9 reported a clean exit")
	}
	send(1000)
	a.start()
	send(1000)
	a.awaitReady()

	want := 3000
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, "out", 30*time.Second, func(r []*kgo.Record) bool { return len(r) >= want })
	if err != nil {
		t.Fatal(err)
	}
	if rep := check.Aggregate(inputs, recs); !rep.OK() || rep.Inputs != want {
		t.Fatalf("output: %v", rep)
	}
	for _, p := range []*proc{a, b} {
		code, body := p.get("/metrics")
		if code != http.StatusOK || !strings.Contains(body, "sluice_epoch") || !strings.Contains(body, "sluice_records_in_total") {
			t.Fatalf("/metrics: %d\n%.500s", code, body)
		}
		if code, _ := p.get("/healthz"); code != http.StatusOK {
			t.Fatalf("/healthz: %d", code)
		}
	}
	for _, p := range []*proc{a, b} {
		if err := p.stop(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v; log:\n%s", err, p.log.String())
		}
	}
	// Every process stopped cleanly: no transaction may be left open
	// (one would hold back every read_committed reader until it timed
	// out).
	open, err := check.OpenTransactions(context.Background(), []string{brokers}, "out", "e2e-changelog")
	if err != nil || len(open) > 0 {
		t.Fatalf("after shutdown: open transactions on %v (err %v)", open, err)
	}
}

// With the brokers unreachable the process stays up, retries with backoff,
// says so in its log, reports alive but not ready, and stops cleanly.
func TestBrokerDownIsRetriedAndNotReady(t *testing.T) {
	dead := freeAddr(t) // nothing listens there once freeAddr returns
	p := newProc(t, dead, "down")
	p.start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := p.get("/healthz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never answered; log:\n%s", p.log.String())
		}
		<-time.After(20 * time.Millisecond)
	}
	if code, _ := p.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the brokers down: %d, want 503", code)
	}
	for !strings.Contains(p.log.String(), "retrying") {
		if time.Now().After(deadline) {
			t.Fatalf("log does not mention the retry:\n%s", p.log.String())
		}
		<-time.After(50 * time.Millisecond)
	}
	if code, _ := p.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while retrying: %d, want 503", code)
	}
	if err := p.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM with the brokers down: %v", err)
	}
}

// A state directory that cannot be created stops the processor at once with
// status 1 and a line naming the path, before it joins the group.
func TestUnusableStateDirExitsOne(t *testing.T) {
	dir := "/proc/sluice-cannot-create-this"
	cmd := exec.Command(binary)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"),
		"SLUICE_BROKERS=127.0.0.1:1", "SLUICE_APP_ID=app", "SLUICE_JOB=aggregate",
		"SLUICE_INPUT_TOPICS=in", "SLUICE_OUTPUT_TOPIC=out", "SLUICE_INSTANCE_ID=i1",
		"SLUICE_STATE_DIR=" + dir, "SLUICE_METRICS_ADDR=127.0.0.1:0",
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	exit, ok := err.(*exec.ExitError)
	if !ok || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1; stderr: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), dir) {
		t.Fatalf("stderr does not name %s: %s", dir, stderr.String())
	}
}
