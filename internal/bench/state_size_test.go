package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
)

// stateSpec is what BenchmarkStateSize hands its processor child
// (BENCH_STATE_SPEC, JSON).
type stateSpec struct {
	Brokers string `json:"brokers"`
	Backend string `json:"backend"`
	State   string `json:"state"`
	Addr    string `json:"addr"` // where the child serves /metrics, /readyz and /heap
}

// heapReport is the child's /heap answer. HeapInuse and HeapAlloc are read
// right after two forced runtime.GC calls, so they are the live heap plus the
// spans it occupies, not garbage waiting for the next cycle; PeakHeapInuse
// is the largest heap in use (garbage included) the child's sampler saw
// since it started, every 10 ms, without forcing anything.
type heapReport struct {
	HeapInuse     uint64 `json:"heap_inuse"`
	HeapAlloc     uint64 `json:"heap_alloc"`
	PeakHeapInuse uint64 `json:"peak_heap_inuse"`
	RSS           uint64 `json:"rss"` // VmRSS, bytes: includes bbolt's mapped pages
	HWM           uint64 `json:"hwm"` // VmHWM, bytes
}

// runStateChild runs one `aggregate` instance (exactly-once, 100 ms epochs)
// in a process of its own, as the processor binary would, and serves its
// registry plus /heap, which forces a GC and reports the heap: the
// processor binary exports go_memstats_heap_inuse_bytes too, but only as
// of whenever the last GC ran, which at a steady heap can be minutes ago.
func runStateChild() int {
	var s stateSpec
	if err := json.Unmarshal([]byte(os.Getenv("BENCH_STATE_SPEC")), &s); err != nil {
		fmt.Fprintln(os.Stderr, "BENCH_STATE_SPEC:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var peak atomic.Uint64
	go sampleHeap(ctx, &peak)
	reg := prometheus.NewRegistry()
	o := sluiceOptions(s.Brokers, "state", input, output, "aggregate", s.Backend, sluice.ExactlyOnce, 100*time.Millisecond, s.State, reg)
	o.SessionTimeout = 6 * time.Second
	// SLUICE_RESTORE_CONCURRENCY, as the processor binary reads it (unset:
	// the default).
	o.RestoreConcurrency, _ = strconv.Atoi(os.Getenv("SLUICE_RESTORE_CONCURRENCY"))
	inst, err := sluice.New(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "state child:", err)
		return 1
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !inst.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/heap", func(w http.ResponseWriter, _ *http.Request) {
		// Twice: a sync.Pool keeps what it held for one collection
		// more (its victim cache), and bbolt pools its page buffers.
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		rss, hwm := procStatus("VmRSS:"), procStatus("VmHWM:")
		json.NewEncoder(w).Encode(heapReport{HeapInuse: ms.HeapInuse, HeapAlloc: ms.HeapAlloc, PeakHeapInuse: peak.Load(), RSS: rss, HWM: hwm})
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "state child:", err)
		return 1
	}
	go http.Serve(ln, mux)
	if err := inst.Run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "state child:", err)
		return 1
	}
	return 0
}

// sampleHeap keeps the largest heap in use it sees: the bytes of heap
// spans holding objects, live or not yet swept (MemStats.HeapInuse), read
// from runtime/metrics, which stops nothing.
func sampleHeap(ctx context.Context, peak *atomic.Uint64) {
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		metrics.Read(samples)
		if v := samples[0].Value.Uint64() + samples[1].Value.Uint64(); v > peak.Load() {
			peak.Store(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// profileRestore, with BENCH_STATE_PROFILE set to a directory, writes
// profiles of the child's full restore there: restore-cpu.pprof (its first
// 5 s), restore-heap-N.pprof (in use, every 2 s) and, when the returned
// function runs after the restore, restore-allocs.pprof and
// restored-heap.pprof (in use after a GC). The restart with the state dir
// intact writes restart-cpu.pprof (its first 2 s) and restarted-heap.pprof.
func profileRestore(b *testing.B, addr string) func() {
	dir := os.Getenv("BENCH_STATE_PROFILE")
	if dir == "" {
		return func() {}
	}
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		done <- saveProfile(addr, "/debug/pprof/profile?seconds=5", filepath.Join(dir, "restore-cpu.pprof"))
	}()
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Second):
			}
			saveProfile(addr, "/debug/pprof/heap", filepath.Join(dir, fmt.Sprintf("restore-heap-%d.pprof", i)))
		}
	}()
	return func() {
		close(stop)
		if err := <-done; err != nil {
			b.Log("profile:", err)
		}
		for _, p := range [][2]string{{"/debug/pprof/allocs", "restore-allocs.pprof"}, {"/debug/pprof/heap?gc=1", "restored-heap.pprof"}} {
			if err := saveProfile(addr, p[0], filepath.Join(dir, p[1])); err != nil {
				b.Log("profile:", err)
			}
		}
	}
}

// saveProfile writes what the child serves at path to file, waiting up to a
// second for the child to listen.
func saveProfile(addr, path, file string) error {
	var resp *http.Response
	var err error
	for range 100 {
		if resp, err = http.Get("http://" + addr + path); err == nil {
			break
		}
		<-time.After(10 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.ReadFrom(resp.Body)
	return err
}

// procStatus reads one field of /proc/self/status in bytes.
func procStatus(field string) uint64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// stateSizes are BenchmarkStateSize's key counts: BENCH_STATE_KEYS (a
// comma-separated list) or 1M and 10M.
func stateSizes(b *testing.B) []int {
	v := os.Getenv("BENCH_STATE_KEYS")
	if v == "" {
		return []int{1000000, 10000000}
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("BENCH_STATE_KEYS: %q is not a key count", f)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkStateSize measures what state size costs one instance of the
// aggregate job (4 tasks, exactly-once, 100 ms epochs) with the bbolt
// backend, at each size of stateSizes (one key per input record, then
// updates spread over all keys):
//
//   - the Go heap (after a forced GC) while it builds the state, while it
//     updates it, and after a kill -9 (BENCH_STATE_STOP=term: a SIGTERM)
//     and a restart with the state dir intact;
//   - that restart's time from exec to the first record processed;
//   - a restore from scratch (state dir deleted, changelog compacted): its
//     rate to ready, and the peak heap and RSS of the process meanwhile.
//
// The sub-benchmark memory/ does the same with the memory backend at the
// smallest size (its restart is a full restore), for the heap the memory
// backend costs against the logical bytes sluice_state_bytes reports.
//
// Run by name: go test -run '^$' -bench StateSize -benchtime 1x -timeout 60m ./internal/bench
func BenchmarkStateSize(b *testing.B) {
	sizes := stateSizes(b)
	for _, n := range sizes {
		b.Run(fmt.Sprintf("bbolt/keys=%d", n), func(b *testing.B) { stateSizeRun(b, "bbolt", n) })
	}
	b.Run(fmt.Sprintf("memory/keys=%d", sizes[0]), func(b *testing.B) { stateSizeRun(b, "memory", sizes[0]) })
}

func stateSizeRun(b *testing.B, backend string, keys int) {
	const mib = 1 << 20
	for range b.N {
		b.StopTimer()
		c, brokers, state, addr := processSetup(b, partitions)
		raw, _ := json.Marshal(stateSpec{Brokers: brokers, Backend: backend, State: state, Addr: addr})
		start := func() *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
			cmd.Env = append(os.Environ(), "BENCH_CHILD=state", "BENCH_STATE_SPEC="+string(raw))
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			return cmd
		}
		kill := func(cmd *exec.Cmd) {
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
		}
		// BENCH_STATE_STOP=term stops the instance before the restart
		// with SIGTERM (a clean close: no consistency check at the next
		// open) instead of kill -9.
		stopForRestart := kill
		if os.Getenv("BENCH_STATE_STOP") == "term" {
			stopForRestart = func(cmd *exec.Cmd) {
				cmd.Process.Signal(syscall.SIGTERM)
				if err := cmd.Wait(); err != nil {
					b.Fatalf("stopping with SIGTERM: %v", err)
				}
			}
		}
		heap := func() heapReport {
			resp, err := http.Get("http://" + addr + "/heap")
			if err != nil {
				b.Fatal(err)
			}
			defer resp.Body.Close()
			var h heapReport
			if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
				b.Fatal(err)
			}
			return h
		}
		metric := func(name string) float64 {
			v, _ := metricSum(addr, name)
			return v
		}
		prod, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
		if err != nil {
			b.Fatal(err)
		}
		// key(i) for i < keys; updates walk the key space with a stride
		// coprime to it, so they land all over every task's tree.
		produce := func(from, to int, key func(int) int) error {
			for i := from; i < to; i++ {
				prod.Produce(context.Background(), &kgo.Record{Topic: input, Key: fmt.Appendf(nil, "key-%08d", key(i)), Value: []byte(strconv.Itoa(i))}, nil)
			}
			return prod.Flush(context.Background())
		}
		send := func(from, to int, key func(int) int) {
			if err := produce(from, to, key); err != nil {
				b.Fatal(err)
			}
		}
		same := func(i int) int { return i }
		spread := func(i int) int { return int((int64(i) * 2654435761) % int64(keys)) }

		t0 := time.Now()
		send(0, keys, same)
		preload := time.Since(t0)

		// Build: one new key per record. The heap is sampled as the
		// state grows.
		cmd := start()
		var buildHeap []string
		var buildMax uint64
		next := time.Now()
		built := waitFor(b, "building the state", 30*time.Minute, func() bool {
			k := metric("sluice_state_keys")
			if time.Now().After(next) && k > 0 {
				h := heap()
				buildMax = max(buildMax, h.HeapInuse)
				buildHeap = append(buildHeap, fmt.Sprintf("%.0fk:%.0f", k/1000, float64(h.HeapInuse)/mib))
				next = time.Now().Add(3 * time.Second)
			}
			return k >= float64(keys)
		})
		stateBytes := metric("sluice_state_bytes")
		afterBuild := heap()

		// Steady state: updates of existing keys, heap sampled while
		// they are processed.
		updates := min(keys/2, 500000)
		in0 := metric("sluice_records_in_total")
		t0 = time.Now()
		sent := make(chan error, 1)
		go func() { sent <- produce(keys, keys+updates, spread) }()
		var steadyMax uint64
		next = time.Now()
		waitFor(b, "processing the updates", 30*time.Minute, func() bool {
			if time.Now().After(next) {
				steadyMax = max(steadyMax, heap().HeapInuse)
				next = time.Now().Add(time.Second)
			}
			return metric("sluice_records_in_total") >= in0+float64(updates)
		})
		updateRate := float64(updates) / time.Since(t0).Seconds()
		if err := <-sent; err != nil {
			b.Fatal(err)
		}
		stopForRestart(cmd)

		// Restart with the state dir intact, to the first record
		// processed (a tail of records arrived while it was down).
		const tail = 1000
		send(keys+updates, keys+updates+tail, spread)
		t0 = time.Now()
		cmd = start()
		restartProfiled := make(chan error, 1)
		if dir := os.Getenv("BENCH_STATE_PROFILE"); dir != "" {
			go func() {
				restartProfiled <- saveProfile(addr, "/debug/pprof/profile?seconds=2", filepath.Join(dir, "restart-cpu.pprof"))
			}()
		} else {
			restartProfiled <- nil
		}
		restart := waitFor(b, "restart to the first record", 10*time.Minute, func() bool { return metric("sluice_records_in_total") > 0 })
		waitFor(b, "processing the tail", 10*time.Minute, func() bool { return metric("sluice_records_in_total") >= tail })
		tailRead := metric("sluice_restore_records_done")
		afterRestart := heap()
		if err := <-restartProfiled; err != nil {
			b.Log("profile:", err)
		}
		if dir := os.Getenv("BENCH_STATE_PROFILE"); dir != "" {
			if err := saveProfile(addr, "/debug/pprof/heap?gc=1", filepath.Join(dir, "restarted-heap.pprof")); err != nil {
				b.Log("profile:", err)
			}
		}
		kill(cmd)

		// Restore from scratch: the state dir deleted, the changelog
		// compacted as a long-running app's is.
		var restoreTime time.Duration
		var restored float64
		var afterRestore heapReport
		if backend == "bbolt" {
			if err := os.RemoveAll(state); err != nil {
				b.Fatal(err)
			}
			c.Compact()
			b.StartTimer()
			cmd = start()
			profiled := profileRestore(b, addr)
			restoreTime = waitFor(b, "ready after a full restore", 30*time.Minute, func() bool { return ready(addr) })
			b.StopTimer()
			profiled()
			restored = metric("sluice_restore_records_done")
			// As after the restart: the heap once the task processes.
			send(keys+updates+tail, keys+updates+2*tail, spread)
			waitFor(b, "processing after the restore", 10*time.Minute, func() bool { return metric("sluice_records_in_total") >= tail })
			afterRestore = heap()
			kill(cmd)
		} else {
			// The memory backend restores in full at every start: the
			// restart above was one, from the uncompacted changelog.
			restoreTime, restored, afterRestore = restart, tailRead, afterRestart
		}
		prod.Close()
		c.Close()

		b.Logf("%s %d keys: preload %v, build %v (heap by keys, MiB: %s), logical state %.0f MiB",
			backend, keys, preload.Round(time.Second), built.Round(time.Second), strings.Join(buildHeap, " "), stateBytes/mib)
		b.Logf("heap MiB after GC: built %.0f, updates max %.0f, after restart %.0f, after full restore %.0f (peak heap in use %.0f, VmHWM %.0f)",
			float64(afterBuild.HeapInuse)/mib, float64(steadyMax)/mib, float64(afterRestart.HeapInuse)/mib,
			float64(afterRestore.HeapInuse)/mib, float64(afterRestore.PeakHeapInuse)/mib, float64(afterRestore.HWM)/mib)
		b.Logf("restart to first record %v (changelog records read %.0f); full restore %v, %.0f records, %.0f records/s",
			restart.Round(time.Millisecond), tailRead, restoreTime.Round(time.Millisecond), restored, restored/restoreTime.Seconds())

		b.ReportMetric(built.Seconds(), "s-build")
		b.ReportMetric(stateBytes/mib, "MiB-state-logical")
		b.ReportMetric(float64(afterBuild.HeapInuse)/mib, "MiB-heap-built")
		b.ReportMetric(float64(buildMax)/mib, "MiB-heap-build-max")
		b.ReportMetric(float64(steadyMax)/mib, "MiB-heap-updates-max")
		b.ReportMetric(updateRate, "records/s-updates")
		b.ReportMetric(restart.Seconds(), "s-restart-to-first-record")
		b.ReportMetric(tailRead, "records-read-at-restart")
		b.ReportMetric(float64(afterRestart.HeapInuse)/mib, "MiB-heap-after-restart")
		b.ReportMetric(restoreTime.Seconds(), "s-full-restore")
		b.ReportMetric(restored/restoreTime.Seconds(), "records/s-full-restore")
		b.ReportMetric(float64(afterRestore.PeakHeapInuse)/mib, "MiB-peak-heap-full-restore")
		b.ReportMetric(float64(afterRestore.HWM)/mib, "MiB-peak-RSS-full-restore")
		b.ReportMetric(float64(afterRestore.HeapInuse)/mib, "MiB-heap-after-full-restore")
	}
}
