package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkFailover measures what a crash costs the instance that takes
// over, with and without standby replicas (SLUICE_STANDBY_REPLICAS): two
// processor processes of the aggregate job over 4 partitions share
// 1,000,000 keys; once the state is built (and, with standbys, the
// standbys have read it), the first is killed with SIGKILL. Reported: the
// time from the kill until the second runs every task (the 6 s session
// timeout, then the restores), the time from its first restoring task to
// every task running, and the changelog records those restores read.
//
//	go test -run '^$' -bench Failover -benchtime 1x ./internal/bench/
func BenchmarkFailover(b *testing.B) {
	for _, standbys := range []int{0, 1} {
		b.Run(fmt.Sprintf("standbys=%d", standbys), func(b *testing.B) { benchFailover(b, standbys) })
	}
}

func benchFailover(b *testing.B, standbys int) {
	const keys, partitions = 1000000, 4
	bin := processorBinary(b)
	for range b.N {
		b.StopTimer()
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, input, output))
		if err != nil {
			b.Fatal(err)
		}
		brokers := c.ListenAddrs()[0]
		start := func(id string) (*exec.Cmd, string) {
			return startProcessor(b, bin, brokers, "failover", id, "SLUICE_STANDBY_REPLICAS="+strconv.Itoa(standbys))
		}
		preloadKeys(b, brokers, keys)
		first, addr1 := start("f1")
		waitFor(b, "the first instance ready", 5*time.Minute, func() bool { return ready(addr1) })
		second, addr2 := start("f2")
		sum := func(addr, name string) float64 { v, _ := metricSum(addr, name); return v }
		waitFor(b, "1M keys built over both", 10*time.Minute, func() bool {
			return ready(addr2) && sum(addr1, "sluice_state_keys")+sum(addr2, "sluice_state_keys") >= keys &&
				sum(addr1, `sluice_tasks{state="running"}`) == 2 && sum(addr2, `sluice_tasks{state="running"}`) == 2
		})
		if standbys > 0 {
			// The standbys have read the first's changelog: their count
			// of records read stops growing.
			last := -1.0
			waitFor(b, "the standbys caught up", 5*time.Minute, func() bool {
				v := sum(addr2, "sluice_standby_records_total")
				done := v > 0 && v == last
				last = v
				<-time.After(time.Second) // sampling, in a benchmark
				return done
			})
		}
		restoredBefore := sum(addr2, "sluice_restore_records_done")

		b.StartTimer()
		killed := time.Now()
		first.Process.Signal(syscall.SIGKILL)
		first.Wait()
		var restoring time.Time
		waitFor(b, "the second running every task", 5*time.Minute, func() bool {
			if restoring.IsZero() && (sum(addr2, `sluice_tasks{state="restoring"}`) > 0 || sum(addr2, `sluice_tasks{state="running"}`) > 2) {
				restoring = time.Now()
			}
			return sum(addr2, `sluice_tasks{state="running"}`) == partitions
		})
		end := time.Now()
		b.StopTimer()
		read := sum(addr2, "sluice_restore_records_done") - restoredBefore
		b.ReportMetric(end.Sub(killed).Seconds(), "s-kill-to-all-running")
		b.ReportMetric(end.Sub(restoring).Seconds(), "s-restoring-to-all-running")
		b.ReportMetric(read, "changelog-records-read")
		second.Process.Signal(syscall.SIGKILL)
		second.Wait()
		c.Close()
	}
}

// startProcessor starts a processor process of the aggregate job, instance
// id of app, reading input and writing output on brokers, with env added;
// it returns the process and its metrics address.
func startProcessor(b *testing.B, bin, brokers, app, id string, env ...string) (*exec.Cmd, string) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "SLUICE_BROKERS="+brokers, "SLUICE_APP_ID="+app, "SLUICE_JOB=aggregate",
		"SLUICE_INPUT_TOPICS="+input, "SLUICE_OUTPUT_TOPIC="+output, "SLUICE_INSTANCE_ID="+id,
		"SLUICE_STATE_DIR="+filepath.Join(b.TempDir(), id), "SLUICE_METRICS_ADDR="+addr, "SLUICE_SESSION_TIMEOUT=6s",
		"SLUICE_LOG_LEVEL=warn")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd, addr
}

// preloadKeys writes one input record for each of keys keys.
func preloadKeys(b *testing.B, brokers string, keys int) {
	b.Helper()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer prod.Close()
	for i := range keys {
		prod.Produce(context.Background(), &kgo.Record{Topic: input, Key: []byte(fmt.Sprintf("key-%07d", i)), Value: []byte(strconv.Itoa(i))}, nil)
	}
	if err := prod.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}
