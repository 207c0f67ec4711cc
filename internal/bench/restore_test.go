package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
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
)

// processorBinary builds cmd/processor once for the benchmarks that run it
// as a process.
func processorBinary(b *testing.B) string {
	path := filepath.Join(b.TempDir(), "processor")
	build := exec.Command("go", "build", "-o", path, "../../cmd/processor")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		b.Fatal(err)
	}
	return path
}

// processSetup is what a benchmark that runs an instance as a process of
// its own needs: a broker with the input and output topics (the caller
// closes it), its address, a state dir, and a free loopback address for
// the instance's metrics.
func processSetup(b *testing.B, partitions int32) (c *kfake.Cluster, brokers, stateDir, addr string) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output))
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	return c, c.ListenAddrs()[0], filepath.Join(b.TempDir(), "state"), addr
}

// metricSum scrapes a processor's /metrics and sums one metric's samples.
func metricSum(addr, name string) (float64, bool) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

func ready(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// peakRSS is a process's peak resident set size (VmHWM) in MiB: the
// instance runs alone in its process, so this bounds what a restore held.
func peakRSS(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

func waitFor(b *testing.B, what string, limit time.Duration, cond func() bool) time.Duration {
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			b.Fatalf("%s: not within %v", what, limit)
		}
		<-time.After(5 * time.Millisecond)
	}
	return time.Since(start)
}

// BenchmarkRestore1M builds 1,000,000 keys of aggregate state, kills the
// instance with SIGKILL and measures (1) restart to processing with the
// state dir intact: only the changelog tail is read; (2) restart with the
// state dir deleted and the changelog compacted: a full restore, in
// records/s and the process's peak memory.
func BenchmarkRestore1M(b *testing.B) {
	const keys = 1000000
	bin := processorBinary(b)
	for range b.N {
		c, brokers, state, metrics := processSetup(b, 4)
		env := append(os.Environ(), "SLUICE_BROKERS="+brokers, "SLUICE_APP_ID=restore", "SLUICE_JOB=aggregate",
			"SLUICE_INPUT_TOPICS="+input, "SLUICE_OUTPUT_TOPIC="+output, "SLUICE_INSTANCE_ID=r1",
			"SLUICE_STATE_DIR="+state, "SLUICE_METRICS_ADDR="+metrics, "SLUICE_SESSION_TIMEOUT=6s", "SLUICE_LOG_LEVEL=warn")
		start := func() *exec.Cmd {
			cmd := exec.Command(bin)
			cmd.Env = env
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			return cmd
		}
		kill := func(cmd *exec.Cmd) {
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
		}
		prod, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
		if err != nil {
			b.Fatal(err)
		}
		send := func(from, to int) {
			for i := from; i < to; i++ {
				prod.Produce(context.Background(), &kgo.Record{Topic: input, Key: []byte(fmt.Sprintf("key-%07d", i)), Value: []byte(strconv.Itoa(i))}, nil)
			}
			if err := prod.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
		}

		b.StopTimer()
		send(0, keys)
		cmd := start()
		built := waitFor(b, "building 1M keys", 10*time.Minute, func() bool {
			v, _ := metricSum(metrics, "sluice_state_keys")
			return v >= keys
		})
		kill(cmd)
		send(keys, keys+1000)

		// (1) Local state intact: only the tail.
		b.StartTimer()
		t0 := time.Now()
		cmd = start()
		toReady := waitFor(b, "ready with local state", 5*time.Minute, func() bool { return ready(metrics) })
		toProcessing := waitFor(b, "processing with local state", 5*time.Minute, func() bool {
			v, _ := metricSum(metrics, "sluice_records_in_total")
			return v > 0
		}) + toReady
		tail, _ := metricSum(metrics, "sluice_restore_records_done")
		b.StopTimer()
		_ = t0
		kill(cmd)

		// (2) State dir lost: everything from the changelog, compacted as
		// a long-running app's is (one marker per partition is left, so
		// a restore that applied only at markers would hold a whole
		// partition in memory).
		if err := os.RemoveAll(state); err != nil {
			b.Fatal(err)
		}
		c.Compact()
		b.StartTimer()
		cmd = start()
		full := waitFor(b, "ready after full restore", 10*time.Minute, func() bool { return ready(metrics) })
		restored, _ := metricSum(metrics, "sluice_restore_records_done")
		b.StopTimer()
		peak := peakRSS(b, cmd.Process.Pid)
		kill(cmd)
		prod.Close()
		c.Close()

		b.ReportMetric(built.Seconds(), "s-to-build-1M-keys")
		b.ReportMetric(toProcessing.Seconds(), "s-restart-to-processing-local")
		b.ReportMetric(tail, "changelog-records-read-local")
		b.ReportMetric(full.Seconds(), "s-full-restore")
		b.ReportMetric(restored, "changelog-records-full")
		b.ReportMetric(restored/full.Seconds(), "records/s-full-restore")
		b.ReportMetric(peak, "MiB-peak-RSS-full-restore")
	}
}
