package systest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/function"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/jobs"
)

// The test binary doubles as a processor: with SYSTEST_CHILD set it runs one
// instance configured from SYSTEST_* variables, so crash tests kill a real
// process (kill -9, SIGSTOP) while the broker lives on in the test process.
func TestMain(m *testing.M) {
	if os.Getenv("SYSTEST_CHILD") != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

func runChild() int {
	env := os.Getenv
	interval, _ := time.ParseDuration(env("SYSTEST_INTERVAL"))
	session, _ := time.ParseDuration(env("SYSTEST_SESSION"))
	crashAfter, _ := strconv.Atoi(env("SYSTEST_CRASH_AFTER"))
	cfg := options(env("SYSTEST_BROKERS"), env("SYSTEST_APP"), env("SYSTEST_ID"), env("SYSTEST_STATE"), env("SYSTEST_JOB"), sluice.Guarantee(env("SYSTEST_GUARANTEE")))
	cfg.Checkpoint.Interval = interval
	cfg.SessionTimeout = session
	cfg.RebalanceTimeout = session * 2 / 3
	if r, err := time.ParseDuration(env("SYSTEST_REBALANCE")); err == nil {
		cfg.RebalanceTimeout = r
	}
	if d, err := time.ParseDuration(env("SYSTEST_TXN_TIMEOUT")); err == nil {
		cfg.TransactionTimeout = d
	}
	cfg.Parallelism, _ = strconv.Atoi(env("SYSTEST_PARALLELISM"))
	cfg.PipelinedEpochs = env("SYSTEST_PIPELINED") == "true"
	cfg.StandbyReplicas, _ = strconv.Atoi(env("SYSTEST_STANDBY"))
	cfg.AcceptableRecoveryLag, _ = strconv.ParseInt(env("SYSTEST_RECOVERY_LAG"), 10, 64)
	level := slog.LevelInfo
	if env("SYSTEST_LOG_DIR") != "" {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if url := env("SYSTEST_PG_URL"); url != "" {
		if err := withSink(&cfg, url, env("SYSTEST_JOB")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer cfg.Sink.Close()
	}
	if point := env("SYSTEST_CRASH_AT"); point != "" {
		seen := 0
		when := crashCondition(cfg.Registry.(*prometheus.Registry), env("SYSTEST_CRASH_WHEN"))
		cfg.Hook = func(p string) {
			if p != point || !when() {
				return
			}
			if seen++; seen > crashAfter {
				fmt.Fprintf(os.Stderr, "systest: crashing at %s\n", p)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}
	}
	if cfg.PipelinedEpochs {
		// The chaos runs check that epochs did overlap (chaos.shutdown).
		// A pipeline's stages share the hook, each on its goroutine.
		overlapped := crashCondition(cfg.Registry.(*prometheus.Registry), "sluice_overlapped_records_total>=1")
		var said atomic.Bool
		hook := cfg.Hook
		cfg.Hook = func(p string) {
			if p == sluice.PointAfterCommit && !said.Load() && overlapped() && said.CompareAndSwap(false, true) {
				fmt.Fprintln(os.Stderr, overlapNote)
			}
			if hook != nil {
				hook(p)
			}
		}
	}
	ctx, stop := signalContext()
	defer stop()
	if env("SYSTEST_JOB") == "function" {
		// The aggregate computed by a function beside the instance (see
		// function_test.go): the job comes from its Describe.
		job, err := function.New(ctx, function.Options{URL: env("SYSTEST_FUNCTION_URL"), AppID: cfg.AppID, Registry: cfg.Registry, Logger: cfg.Logger})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		cfg.Job = job
	}
	var inst interface{ Run(context.Context) error }
	var err error
	if env("SYSTEST_JOB") == "wordcount" {
		inst, err = sluice.NewPipeline(cfg, jobs.WordCount()...)
	} else {
		inst, err = sluice.New(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := inst.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		return 1
	}
	return 0
}

const (
	input  = "in"
	input2 = "in2" // the second input of co-processing tests
	output = "out"
)

// overlapNote is what an instance with pipelined epochs writes to its log
// once records were processed while the epoch before them committed.
const overlapNote = "systest: records processed during an overlap"

// crashCondition parses SYSTEST_CRASH_WHEN, "metric>=value": the crash
// point counts only once the instance's metric (summed over its series)
// reached value. Empty is always true.
func crashCondition(reg *prometheus.Registry, spec string) func() bool {
	if spec == "" {
		return func() bool { return true }
	}
	name, v, _ := strings.Cut(spec, ">=")
	want, _ := strconv.ParseFloat(v, 64)
	return func() bool {
		sum, _ := check.MetricSum(reg, name)
		return sum >= want
	}
}

func options(brokers, app, id, state, job string, g sluice.Guarantee) sluice.Options {
	j := jobs.Aggregate()
	switch job {
	case "echo":
		j = jobs.Echo()
	case "rising-event":
		j = jobs.RisingTemperature(jobs.RisingOptions{Window: 10 * time.Second, EventTime: true})
	case "rising-processing":
		j = jobs.RisingTemperature(jobs.RisingOptions{Window: 5 * time.Second})
	case "history":
		j = historyJob
	}
	inputs := []string{input}
	if job == "history" {
		inputs = []string{input, input2}
	}
	return sluice.Options{
		Brokers:       []string{brokers},
		GroupProtocol: groupProtocol(),
		AppID:         app,
		InstanceID:    id,
		Job:           j,
		InputTopics:   inputs,
		OutputTopic:   output,
		StateDir:      state,
		Backend:       "bbolt",
		Guarantee:     g,
		Checkpoint: barrier.Config{
			Interval:          50 * time.Millisecond,
			Timeout:           9 * time.Second,
			TolerableFailures: 3,
		},
		TransactionTimeout: 10 * time.Second,
		SessionTimeout:     6 * time.Second,
		RebalanceTimeout:   4 * time.Second,
		// The history job's tests want its two inputs in timestamp
		// order whatever the machine's load: with the default second,
		// a task that could not fetch a lagging input within it goes on
		// without it, by design.
		MaxTaskIdle: 30 * time.Second,
		Registry:    prometheus.NewRegistry(),
		Logger:      testLogger(),
	}
}

// groupProtocol is SYSTEST_GROUP_PROTOCOL: the group protocol (classic or
// consumer) of the instances of every test that does not name one; empty
// leaves the engine's default. Child processes inherit it with the
// environment.
func groupProtocol() string { return os.Getenv("SYSTEST_GROUP_PROTOCOL") }

// protocols are the group protocols a test that covers both runs under:
// both, unless SYSTEST_GROUP_PROTOCOL names one.
func protocols() []string {
	if p := groupProtocol(); p != "" {
		return []string{p}
	}
	return []string{"classic", "consumer"}
}

// kip848Heartbeat makes the test brokers heartbeat KIP-848 members every
// 2s, what Kafka would answer them: the engine sets the group's
// consumer.heartbeat.interval.ms to a third of a session timeout this short
// (6s here), and kfake ignores that group config and answers with its
// broker-level default, 5s, which leaves a member 1s of slack before its
// session expires.
var kip848Heartbeat = kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "2000"})

func newCluster(t *testing.T, partitions int32) string {
	t.Helper()
	return newKfake(t, partitions).ListenAddrs()[0]
}

// newKfake is newCluster's broker, for a test that controls its requests.
func newKfake(t *testing.T, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output), kip848Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// feeder produces keyed integer input and remembers it for the check.
type feeder struct {
	t      *testing.T
	cl     *kgo.Client
	rng    *rand.Rand
	keys   int
	mu     sync.Mutex
	values map[string][]int64
	bad    int
	n      int
	raw    map[int32][][]byte // echo: values per partition in order
	// words: when set, produce sends unkeyed lines of words (wordcount's
	// input) and counts each word's occurrences here.
	words map[string]int
}

func newFeeder(t *testing.T, brokers string, keys int, seed uint64) *feeder {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &feeder{t: t, cl: cl, rng: rand.New(rand.NewPCG(seed, seed)), keys: keys, values: map[string][]int64{}, raw: map[int32][][]byte{}}
}

// produce sends n records synchronously; every badEvery-th is not an
// integer (0 = never).
func (f *feeder) produce(n, badEvery int) {
	f.t.Helper()
	recs := make([]*kgo.Record, 0, n)
	f.mu.Lock()
	for range n {
		f.n++
		key := "k" + strconv.Itoa(f.rng.IntN(f.keys))
		var val string
		if f.words != nil {
			var line []string
			for range 1 + f.rng.IntN(5) {
				w := "w" + strconv.Itoa(f.rng.IntN(f.keys))
				line = append(line, w)
				f.words[w]++
			}
			recs = append(recs, &kgo.Record{Topic: input, Value: []byte(strings.Join(line, " "))})
			continue
		}
		if badEvery > 0 && f.n%badEvery == 0 {
			val = "x" + strconv.Itoa(f.n)
			f.bad++
		} else {
			v := f.rng.Int64N(2001) - 1000
			val = strconv.FormatInt(v, 10)
			f.values[key] = append(f.values[key], v)
		}
		recs = append(recs, &kgo.Record{Topic: input, Key: []byte(key), Value: []byte(val + "")})
	}
	f.mu.Unlock()
	res := f.cl.ProduceSync(context.Background(), recs...)
	if err := res.FirstErr(); err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	for _, r := range recs {
		f.raw[r.Partition] = append(f.raw[r.Partition], append([]byte(string(r.Key)+"="), r.Value...))
	}
	f.mu.Unlock()
}

func (f *feeder) valid() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n - f.bad
}

// awaitIdle is how long the reads that end at a condition (every input
// reflected, a count settled) wait for a first or a next record before
// they give up and let the test report what is missing. A passing run ends
// at its condition; the bound covers a restart, a restore or a group join
// before the first record on a busy machine, where 10-30 s did not always.
const awaitIdle = 45 * time.Second

// awaitAggregate reads the output read_committed until every valid input
// has an output (or nothing arrives for idle), then checks it.
func awaitAggregate(t *testing.T, brokers string, f *feeder, idle time.Duration) check.Report {
	t.Helper()
	more, err := check.ReadCommitted(context.Background(), []string{brokers}, output, idle, check.Settled(f.valid()))
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return check.Aggregate(f.values, more)
}

// awaitEcho reads the echo output until it has as many records as the input
// and compares partition by partition.
func awaitEcho(t *testing.T, brokers string, f *feeder, idle time.Duration) check.Report {
	t.Helper()
	byPartition := func(recs []*kgo.Record) map[int32][][]byte {
		out := map[int32][][]byte{}
		for _, r := range recs {
			out[r.Partition] = append(out[r.Partition], append([]byte(string(r.Key)+"="), r.Value...))
		}
		return out
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Done when every input has arrived: at-least-once, duplicates can
	// make up the count before the last inputs do.
	seen := 0
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, idle, func(r []*kgo.Record) bool {
		if len(r) < f.n || len(r) == seen {
			return false
		}
		seen = len(r)
		return check.Echo(f.raw, byPartition(r)).Lost == 0
	})
	if err != nil {
		t.Fatal(err)
	}
	return check.Echo(f.raw, byPartition(recs))
}

// inProcess runs an instance in this process until stopped.
type inProcess struct {
	cancel context.CancelFunc
	done   chan error
	inst   *sluice.Instance
}

func startInProcess(t *testing.T, cfg sluice.Options) *inProcess {
	t.Helper()
	inst, err := sluice.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &inProcess{cancel: cancel, done: make(chan error, 1), inst: inst}
	go func() { p.done <- inst.Run(ctx) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// awaitReady waits (with a deadline) until the instance is in the group
// with every assigned task running.
func (p *inProcess) awaitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !p.inst.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("instance not ready after 30s")
		}
		<-time.After(10 * time.Millisecond)
	}
}

func (p *inProcess) stop(t *testing.T) {
	if p.cancel == nil {
		return
	}
	p.cancel()
	p.cancel = nil
	if err := <-p.done; err != nil {
		t.Errorf("instance: %v", err)
	}
}

// child is an instance in a subprocess (this test binary).
type child struct {
	t      *testing.T
	id     string
	env    []string
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

func newChild(t *testing.T, brokers, app, id, state, job string, g sluice.Guarantee, extra ...string) *child {
	dir := os.Getenv("SYSTEST_LOG_DIR") // keep the instances' logs there
	if dir == "" {
		dir = t.TempDir()
	}
	logPath := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+id+".log")
	env := append(os.Environ(),
		"SYSTEST_CHILD=1",
		"SYSTEST_BROKERS="+brokers,
		"SYSTEST_APP="+app,
		"SYSTEST_ID="+id,
		"SYSTEST_STATE="+state,
		"SYSTEST_JOB="+job,
		"SYSTEST_GUARANTEE="+string(g),
		"SYSTEST_INTERVAL=100ms",
		"SYSTEST_SESSION=6s",
	)
	// Later entries win: exec takes the last value of a repeated variable.
	return &child{t: t, id: id, env: append(env, extra...), log: logPath}
}

func (c *child) start(extra ...string) {
	c.t.Helper()
	logf, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append([]string{}, c.env...), extra...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A child never outlives the test binary: a stray instance would join
	// a later test's broker if that broker got its port.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.cmd, c.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(exited)
	}(c.exited)
	c.t.Cleanup(func() { c.signal(syscall.SIGKILL); c.wait(10 * time.Second) })
}

func (c *child) signal(sig syscall.Signal) {
	if c.cmd != nil && c.cmd.Process != nil {
		c.cmd.Process.Signal(sig)
	}
}

// wait waits for the process to exit; false if it is still running at the
// deadline.
func (c *child) wait(d time.Duration) bool {
	if c.cmd == nil {
		return true
	}
	select {
	case <-c.exited:
		c.cmd = nil
		return true
	case <-time.After(d):
		return false
	}
}

func (c *child) running() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.exited:
		c.cmd = nil
		return false
	default:
		return true
	}
}

// logged waits until the child's log holds text; false at the deadline.
func (c *child) logged(text string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c.said(text) {
			return true
		}
		c.wait(50 * time.Millisecond)
	}
	return false
}

// crashed reports whether the child killed itself at its crash point.
func (c *child) crashed() bool { return c.said("systest: crashing at") }

// said reports whether the child's log, over all its runs, holds text.
func (c *child) said(text string) bool {
	b, _ := os.ReadFile(c.log)
	return strings.Contains(string(b), text)
}

func (c *child) dumpLog() { c.dumpTail(8000) }

func (c *child) dumpTail(n int) {
	b, _ := os.ReadFile(c.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	c.t.Logf("log of %s (tail):\n%s", c.id, b)
}

// dumpStuck ends a child that did not get where the test waited for with
// SIGQUIT, and logs the end of its log: Go's dump of its goroutines says
// where it stood.
func (c *child) dumpStuck() {
	c.signal(syscall.SIGQUIT)
	c.wait(10 * time.Second)
	c.dumpTail(200_000)
}

// testLogger discards in-process instances' logs unless SYSTEST_LOG_DIR
// asks for them (then they go to stderr, shown with -v or on failure).
func testLogger() *slog.Logger {
	if os.Getenv("SYSTEST_LOG_DIR") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
