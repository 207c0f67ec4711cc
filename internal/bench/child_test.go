package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/gctune"
)

// The test binary doubles as the broker and as each contender of
// BenchmarkContenders: with BENCH_CHILD set it runs one of them, so that
// each is measured in a process of its own (CPU, RSS, profiles) and the
// broker is a separate process, as users run it.
func TestMain(m *testing.M) {
	switch os.Getenv("BENCH_CHILD") {
	case "broker":
		os.Exit(runBrokerChild())
	case "contender":
		os.Exit(runContenderChild())
	case "state":
		os.Exit(runStateChild())
	}
	os.Exit(m.Run())
}

// runBrokerChild runs a single-node kfake broker (what `processor broker`
// runs) and prints its address on stdout, until SIGTERM.
func runBrokerChild() int {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench broker:", err)
		return 1
	}
	defer c.Close()
	if dir, name := os.Getenv("BENCH_PROFILE"), os.Getenv("BENCH_BROKER_PROFILE"); dir != "" && name != "" {
		// The broker's CPU profile over its life: the throughput
		// broker's is over the whole run (every contender).
		f, err := os.Create(filepath.Join(dir, name))
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench broker:", err)
			return 1
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	fmt.Println("broker", c.ListenAddrs()[0])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	return 0
}

// spec is one contender as the parent hands it to its child (BENCH_SPEC,
// JSON).
type spec struct {
	Name      string        `json:"name"`
	Raw       bool          `json:"raw"`       // a raw franz-go loop, not Sluice
	Job       string        `json:"job"`       // echo, aggregate or hash (Sluice)
	EOS       bool          `json:"eos"`       // exactly-once, else at-least-once
	Backend   string        `json:"backend"`   // bbolt or memory (Sluice)
	Interval  time.Duration `json:"interval"`  // checkpoint / commit interval
	Brokers   string        `json:"brokers"`   // set by the parent
	Group     string        `json:"group"`     // set by the parent
	In        string        `json:"in"`        // set by the parent
	Out       string        `json:"out"`       // set by the parent
	State     string        `json:"state"`     // set by the parent
	Result    string        `json:"result"`    // file the child writes its childResult to
	CPUProf   string        `json:"cpuprof"`   // optional CPU profile of the child
	AllocProf string        `json:"allocprof"` // optional allocation profile of the child
	Trace     string        `json:"trace"`     // optional execution trace of the child
	// Parallelism is Options.Parallelism (Sluice; 0 is the default, 1).
	Parallelism int `json:"parallelism"`
	// Pipelined is Options.PipelinedEpochs (Sluice).
	Pipelined bool `json:"pipelined"`
	// FetchMaxPartitionBytes, if set, is the raw loop's
	// kgo.FetchMaxPartitionBytes (0: franz-go's default, 1 MiB).
	FetchMaxPartitionBytes int32 `json:"fetch_max_partition_bytes"`
}

// childResult is what a contender writes when it stops: what only the
// process itself can see.
type childResult struct {
	Mallocs       uint64  `json:"mallocs"`
	AllocBytes    uint64  `json:"alloc_bytes"`
	CheckpointP50 float64 `json:"checkpoint_p50_ms"` // 0: no histogram (raw loops)
	CheckpointP99 float64 `json:"checkpoint_p99_ms"`
	Checkpoints   uint64  `json:"checkpoints"`
	CheckpointSum float64 `json:"checkpoint_sum_s"` // seconds spent from barriers to applied epochs
	Overlapped    float64 `json:"overlapped"`       // sluice_overlapped_records_total
}

func runContenderChild() int {
	var s spec
	if err := json.Unmarshal([]byte(os.Getenv("BENCH_SPEC")), &s); err != nil {
		fmt.Fprintln(os.Stderr, "BENCH_SPEC:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if s.CPUProf != "" {
		f, err := os.Create(s.CPUProf)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	if s.Trace != "" {
		// The parent marks the steady part of the run: SIGUSR1 at the
		// first committed offsets, SIGUSR2 once all are committed.
		f, err := os.Create(s.Trace)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		sig := make(chan os.Signal, 2)
		signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
		go func() {
			for v := range sig {
				if v == syscall.SIGUSR1 {
					trace.Start(f)
				} else {
					trace.Stop()
				}
			}
		}()
	}
	reg := prometheus.NewRegistry()
	var err error
	if s.Raw {
		var extra []kgo.Opt
		if s.FetchMaxPartitionBytes > 0 {
			extra = append(extra, kgo.FetchMaxPartitionBytes(s.FetchMaxPartitionBytes))
		}
		var work func(*kgo.Record) ([]byte, error)
		if s.Job == "aggregate" {
			work = rawAggregate()
		}
		err = rawLoopWith(ctx, s.Brokers, s.Group, s.In, s.Out, s.EOS, s.Interval, work, extra...)
	} else {
		// What the processor binary does before it runs (the raw loops
		// keep Go's defaults, as a program of their own would).
		if _, err := gctune.Apply(s.Backend); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		g := sluice.AtLeastOnce
		if s.EOS {
			g = sluice.ExactlyOnce
		}
		o := sluiceOptions(s.Brokers, s.Group, s.In, s.Out, s.Job, s.Backend, g, s.Interval, s.State, reg)
		o.Parallelism = s.Parallelism
		o.PipelinedEpochs = s.Pipelined
		err = sluiceLoopWith(ctx, o)
	}
	if s.CPUProf != "" {
		pprof.StopCPUProfile()
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "contender:", err)
		return 1
	}
	var res childResult
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.Mallocs, res.AllocBytes = ms.Mallocs, ms.TotalAlloc
	if s.AllocProf != "" {
		f, err := os.Create(s.AllocProf)
		if err == nil {
			pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	res.CheckpointP50, res.CheckpointP99, res.Checkpoints, res.CheckpointSum = checkpointQuantiles(reg)
	res.Overlapped, _ = check.MetricSum(reg, "sluice_overlapped_records_total")
	raw, _ := json.Marshal(res)
	if err := os.WriteFile(s.Result, raw, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// checkpointQuantiles reads the instance's
// sluice_checkpoint_duration_seconds histogram and returns its p50 and p99
// in milliseconds, interpolated linearly within the bucket as Prometheus's
// histogram_quantile does (so within a factor of 2: the buckets double),
// the number of checkpoints and their total duration in seconds.
func checkpointQuantiles(reg *prometheus.Registry) (p50, p99 float64, n uint64, sum float64) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, 0, 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_checkpoint_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			n = h.GetSampleCount()
			q := func(q float64) float64 {
				rank := q * float64(n)
				lower, below := 0.0, uint64(0)
				for _, bk := range h.GetBucket() {
					if float64(bk.GetCumulativeCount()) >= rank {
						in := bk.GetCumulativeCount() - below
						frac := 1.0
						if in > 0 {
							frac = (rank - float64(below)) / float64(in)
						}
						return (lower + (bk.GetUpperBound()-lower)*frac) * 1000
					}
					lower, below = bk.GetUpperBound(), bk.GetCumulativeCount()
				}
				return lower * 1000 // in the +Inf bucket: its lower bound
			}
			if n > 0 {
				return q(0.5), q(0.99), n, h.GetSampleSum()
			}
		}
	}
	return 0, 0, 0, 0
}

// startBroker starts the broker child and returns its address, and a stop
// that ends it before the benchmark does (SIGTERM, then SIGKILL if it has
// not exited in 10 s). With BENCH_PROFILE set, the broker writes its CPU
// profile there as profile, unless profile is empty.
func startBroker(b *testing.B, profile string) (addr string, pid int, stop func()) {
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), "BENCH_CHILD=broker", "BENCH_BROKER_PROFILE="+profile)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		})
	}
	b.Cleanup(stop)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "broker "); ok {
			go func() {
				for sc.Scan() {
				}
			}()
			return addr, cmd.Process.Pid, stop
		}
	}
	b.Fatal("broker child printed no address")
	return "", 0, nil
}

// startContender starts a contender child; stop sends it SIGTERM and waits
// for its result.
func startContender(b *testing.B, s spec) (pid int, stop func() childResult) {
	raw, _ := json.Marshal(s)
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), "BENCH_CHILD=contender", "BENCH_SPEC="+string(raw))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd.Process.Pid, func() childResult {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("%s: %v", s.Name, err)
		}
		var res childResult
		raw, err := os.ReadFile(s.Result)
		if err != nil {
			b.Fatal(err)
		}
		if err := json.Unmarshal(raw, &res); err != nil {
			b.Fatal(err)
		}
		return res
	}
}

// cpuSeconds is a process's user+system CPU time so far, from
// /proc/<pid>/stat (fields 14 and 15, in clock ticks of 1/100 s, the
// USER_HZ of Linux on amd64 and arm64).
func cpuSeconds(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / 100
}

// machineTicks reads the machine's CPU time from /proc/stat, in ticks
// over every core: busy (all but idle and iowait) and total.
func machineTicks(b *testing.B) (busy, total uint64) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		if i >= 8 {
			break // guest time is counted in user already
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total
}
