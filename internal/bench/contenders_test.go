package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
)

// The contenders of BenchmarkContenders (make bench). The raw franz-go
// loops keep no state and write no changelog: they are the ceiling.
var (
	throughputContenders = []spec{
		{Name: "raw-alos", Raw: true, Interval: 100 * time.Millisecond},
		{Name: "raw-eos", Raw: true, EOS: true, Interval: 100 * time.Millisecond},
		// The raw loops given Sluice's fetch bound (64 KiB a partition,
		// docs/operations.md#fetch-size): what the setting is worth to
		// a loop of one's own. The ratios stay against the defaults.
		{Name: "raw-alos-64k", Raw: true, Interval: 100 * time.Millisecond, FetchMaxPartitionBytes: 64 << 10},
		{Name: "raw-eos-64k", Raw: true, EOS: true, Interval: 100 * time.Millisecond, FetchMaxPartitionBytes: 64 << 10},
		// The aggregate job's work by hand in a raw at-least-once loop,
		// its state in a Go map (rawAggregate): what the job costs
		// without Sluice.
		{Name: "raw-aggregate-alos", Raw: true, Job: "aggregate", Interval: 100 * time.Millisecond},
		// The same in a raw GroupTransactSession loop: the job with
		// exactly-once outputs and offsets, its state neither durable
		// nor restored.
		{Name: "raw-aggregate-eos", Raw: true, EOS: true, Job: "aggregate", Interval: 100 * time.Millisecond},
		{Name: "echo-eos", Job: "echo", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond},
		{Name: "aggregate-eos-bbolt", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond},
		{Name: "aggregate-eos-memory", Job: "aggregate", EOS: true, Backend: "memory", Interval: 100 * time.Millisecond},
		{Name: "aggregate-alos-bbolt", Job: "aggregate", Backend: "bbolt", Interval: 100 * time.Millisecond},
		// Two tasks at once (Options.Parallelism).
		{Name: "echo-eos-p2", Job: "echo", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Parallelism: 2},
		{Name: "aggregate-eos-bbolt-p2", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Parallelism: 2},
		// Each epoch processed while the one before commits
		// (Options.PipelinedEpochs).
		{Name: "echo-eos-pipelined", Job: "echo", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Pipelined: true},
		{Name: "aggregate-eos-bbolt-pipelined", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Pipelined: true},
		{Name: "hash-eos", Job: "hash", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond},
		{Name: "hash-eos-p2", Job: "hash", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Parallelism: 2},
		// The interval sweep of the exactly-once contenders (chart a).
		{Name: "echo-eos", Job: "echo", EOS: true, Backend: "bbolt", Interval: 50 * time.Millisecond},
		{Name: "echo-eos", Job: "echo", EOS: true, Backend: "bbolt", Interval: time.Second},
		{Name: "aggregate-eos-bbolt", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 50 * time.Millisecond},
		{Name: "aggregate-eos-bbolt", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: time.Second},
	}
	latencyContenders = []spec{
		{Name: "raw-alos", Raw: true, Interval: 100 * time.Millisecond},
		{Name: "raw-eos", Raw: true, EOS: true, Interval: 50 * time.Millisecond},
		{Name: "raw-eos", Raw: true, EOS: true, Interval: 100 * time.Millisecond},
		{Name: "raw-eos", Raw: true, EOS: true, Interval: time.Second},
		// Aggregate's outputs here are some 80 bytes of JSON (its sum of
		// microsecond stamps has 20 digits) where the raw loop's are 16:
		// the same job by hand, transactional, is the floor for
		// aggregate's rows.
		{Name: "raw-aggregate-eos", Raw: true, EOS: true, Job: "aggregate", Interval: 50 * time.Millisecond},
		{Name: "raw-aggregate-eos", Raw: true, EOS: true, Job: "aggregate", Interval: 100 * time.Millisecond},
		{Name: "raw-aggregate-eos", Raw: true, EOS: true, Job: "aggregate", Interval: time.Second},
		{Name: "echo-eos", Job: "echo", EOS: true, Backend: "bbolt", Interval: 50 * time.Millisecond},
		{Name: "echo-eos", Job: "echo", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond},
		{Name: "echo-eos", Job: "echo", EOS: true, Backend: "bbolt", Interval: time.Second},
		{Name: "aggregate-eos-bbolt", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 50 * time.Millisecond},
		{Name: "aggregate-eos-bbolt", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond},
		{Name: "aggregate-eos-bbolt", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: time.Second},
		{Name: "echo-eos-pipelined", Job: "echo", EOS: true, Backend: "bbolt", Interval: 50 * time.Millisecond, Pipelined: true},
		{Name: "echo-eos-pipelined", Job: "echo", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Pipelined: true},
		{Name: "echo-eos-pipelined", Job: "echo", EOS: true, Backend: "bbolt", Interval: time.Second, Pipelined: true},
		{Name: "aggregate-eos-bbolt-pipelined", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 50 * time.Millisecond, Pipelined: true},
		{Name: "aggregate-eos-bbolt-pipelined", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: 100 * time.Millisecond, Pipelined: true},
		{Name: "aggregate-eos-bbolt-pipelined", Job: "aggregate", EOS: true, Backend: "bbolt", Interval: time.Second, Pipelined: true},
	}
)

// row is one line of BENCH_OUT (JSON lines): a throughput or latency
// measurement of one contender, or the machine.
type row struct {
	Kind      string  `json:"kind"` // machine, throughput or latency
	Rounds    int     `json:"rounds,omitempty"`
	Contender string  `json:"contender,omitempty"`
	Sluice    bool    `json:"sluice,omitempty"`
	Job       string  `json:"job,omitempty"`
	Guarantee string  `json:"guarantee,omitempty"`
	Backend   string  `json:"backend,omitempty"`
	Interval  float64 `json:"interval_ms,omitempty"`

	Records     int     `json:"records,omitempty"`
	RecordsPerS float64 `json:"records_per_s,omitempty"`
	// RecordsPerSToCommit is the records over the time from the first
	// output to the group's commit of the last input offset: what
	// records_per_s was until 2026-12-06 23:30. It waits for the last
	// interval to end, so at 1 s it measured the interval more than the
	// contender (BENCHMARKS.md, "How to read the ratios").
	RecordsPerSToCommit float64 `json:"records_per_s_to_commit,omitempty"`
	VsRawALOS           float64 `json:"ratio_raw_alos,omitempty"`
	VsRawEOS            float64 `json:"ratio_raw_eos,omitempty"`
	CPUPerM             float64 `json:"cpu_s_per_m_records,omitempty"`
	PeakRSS             float64 `json:"peak_rss_mib,omitempty"`
	AllocsPerRec        float64 `json:"allocs_per_record,omitempty"`
	BytesPerRec         float64 `json:"alloc_bytes_per_record,omitempty"`
	CkptP50             float64 `json:"checkpoint_p50_ms,omitempty"`
	CkptP99             float64 `json:"checkpoint_p99_ms,omitempty"`
	Checkpoints         uint64  `json:"checkpoints,omitempty"`
	// CkptShare is the checkpoints' total duration over the measured
	// window: the share of wall time an epoch was being committed or
	// applied (the apply overlaps the next epoch's processing).
	CkptShare float64 `json:"checkpoint_share,omitempty"`
	// Overlapped is the share of the input processed while the epoch
	// before it committed (sluice_overlapped_records_total; pipelined
	// epochs only).
	Overlapped float64 `json:"overlapped_share,omitempty"`
	// BrokerCPUPerM is the broker process's CPU time per million records
	// over the steady part of the run (first commit to done), and
	// MachineBusy the share of every core of the machine busy then
	// (/proc/stat): what the contender and the broker leave idle.
	BrokerCPUPerM float64 `json:"broker_cpu_s_per_m_records,omitempty"`
	MachineBusy   float64 `json:"machine_busy_share,omitempty"`

	Rate     int     `json:"rate,omitempty"`
	LatP50   float64 `json:"latency_p50_ms,omitempty"`
	LatP99   float64 `json:"latency_p99_ms,omitempty"`
	Received int     `json:"received,omitempty"`
	Produced int     `json:"produced,omitempty"`

	CPUs     int    `json:"cpus,omitempty"`
	CPUModel string `json:"cpu_model,omitempty"`
	Go       string `json:"go,omitempty"`
}

func (s spec) row(kind string) row {
	r := row{Kind: kind, Contender: s.Name, Sluice: !s.Raw, Job: s.Job, Backend: s.Backend,
		Guarantee: "at-least-once", Interval: float64(s.Interval.Milliseconds())}
	if s.EOS {
		r.Guarantee = "exactly-once"
	}
	if s.Raw && s.Job == "" {
		r.Job = "raw"
	}
	return r
}

// BenchmarkContenders is `make bench`: one broker in a process of its own,
// and each contender in a process of its own against it, one after the
// other. Throughput: 3,000,000 preloaded keyed integer records (4
// partitions, 10,000 keys) read by a fresh group; records/s from the
// contender's first output record (its produce timestamp) to the moment
// the group has committed every input offset, with the CPU time and peak
// RSS of its process and its checkpoint durations. Latency: 20,000
// records/s offered for 5 s (or 20 intervals, if longer) to a fresh topic
// on a broker started for the row, read read_committed.
// BENCH_OUT=path writes the rows as JSON lines; BENCH_ONLY=regexp keeps the
// contenders whose name/interval matches; BENCH_PROFILE=dir writes a CPU
// and an allocation profile of each throughput contender there;
// BENCH_TRACE=dir an execution trace of each over the steady part of its
// run (runtime/trace: where the loop goroutine waits, scripts/trace-loop);
// BENCH_RECORDS overrides 3,000,000 and BENCH_ROUNDS the 3 rounds. (A
// round of 1,000,000 records lasted about 2 s, too short on a noisy
// machine: one contender's rounds moved by up to 56 %.) BENCH_PROFILE
// also writes the broker's CPU profile, over the whole run.
func BenchmarkContenders(b *testing.B) {
	n, rounds := 3000000, 3
	if v, err := strconv.Atoi(os.Getenv("BENCH_RECORDS")); err == nil && v > 0 {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	only := regexp.MustCompile(os.Getenv("BENCH_ONLY"))
	for _, v := range []string{"BENCH_PROFILE", "BENCH_TRACE"} {
		if dir := os.Getenv(v); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				b.Fatalf("%s: %v", v, err)
			}
		}
	}
	keep := func(s spec) bool { return only.MatchString(s.Name + "/" + s.Interval.String()) }
	var out *os.File
	if path := os.Getenv("BENCH_OUT"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		out = f
	}
	emit := func(r row) {
		if out != nil {
			raw, _ := json.Marshal(r)
			fmt.Fprintf(out, "%s\n", raw)
		}
	}
	emit(row{Kind: "machine", CPUs: runtime.NumCPU(), CPUModel: cpuModel(), Go: runtime.Version()})

	for range b.N {
		brokers, brokerPID, _ := startBroker(b, "broker.cpu.pprof")
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
		if err != nil {
			b.Fatal(err)
		}
		adm := kadm.NewClient(cl)
		createTopics(b, adm, input)
		// The inputs carry no timestamp (-1), so that every contender's
		// outputs carry the time they are produced, which outputSpan
		// reads: the raw loops' franz-go stamps theirs, and Sluice, whose
		// outputs carry their input's event time, stamps with its
		// processing time an output of an input with none.
		noTimestamp := time.UnixMilli(-1)
		for i := range n {
			cl.Produce(context.Background(), &kgo.Record{Topic: input, Key: []byte("k" + strconv.Itoa(i%10000)), Value: []byte(strconv.Itoa(i)), Timestamp: noTimestamp}, nil)
		}
		if err := cl.Flush(context.Background()); err != nil {
			b.Fatal(err)
		}

		// Rounds interleave (every contender once, then again) so that
		// a change in the machine's load falls on all of them; each
		// figure is the median over the rounds.
		tps, lats := map[int][]row{}, map[int][]row{}
		for round := range rounds {
			for i, s := range throughputContenders {
				if !keep(s) {
					continue
				}
				r := throughputRun(b, adm, brokers, brokerPID, s, fmt.Sprintf("tp%d-r%d", i, round), n)
				b.Logf("round %d %s/%v: %.0f records/s, %.2f CPU s/M (broker %.2f, machine %.0f%% busy), %.0f MiB, checkpoint p50 %.1f ms p99 %.1f ms, %.1f allocs/record, %.1f%% overlapped",
					round, s.Name, s.Interval, r.RecordsPerS, r.CPUPerM, r.BrokerCPUPerM, 100*r.MachineBusy, r.PeakRSS, r.CkptP50, r.CkptP99, r.AllocsPerRec, 100*r.Overlapped)
				tps[i] = append(tps[i], r)
			}
			latencyRound(b, round, keep, lats)
		}
		var rows []row
		for i := range throughputContenders {
			if len(tps[i]) > 0 {
				rows = append(rows, median(tps[i]))
			}
		}
		var rawALOS, rawEOS float64
		for _, r := range rows {
			switch r.Contender {
			case "raw-alos":
				rawALOS = r.RecordsPerS
			case "raw-eos":
				rawEOS = r.RecordsPerS
			}
		}
		for _, r := range rows {
			if rawALOS > 0 {
				r.VsRawALOS = r.RecordsPerS / rawALOS
			}
			if rawEOS > 0 {
				r.VsRawEOS = r.RecordsPerS / rawEOS
			}
			emit(r)
		}
		for i := range latencyContenders {
			if len(lats[i]) > 0 {
				emit(median(lats[i]))
			}
		}
		cl.Close()
	}
}

func createTopics(b *testing.B, adm *kadm.Client, topics ...string) {
	res, err := adm.CreateTopics(context.Background(), partitions, 1, nil, topics...)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		b.Fatal(err)
	}
}

// deleteTopics deletes the topics of a finished contender (its output,
// changelog, and input for latency runs: all named group-...), so that the
// broker's heap, and its GC, grow less over the run. They still grow
// (kfake keeps something of each contender), and the contender during
// which the broker takes new memory from the OS pays for it (BENCHMARKS.md,
// the slow rounds).
func deleteTopics(b *testing.B, adm *kadm.Client, group string) {
	td, err := adm.ListTopics(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for _, name := range td.Names() {
		if strings.HasPrefix(name, group+"-") {
			names = append(names, name)
		}
	}
	if _, err := adm.DeleteTopics(context.Background(), names...); err != nil {
		b.Fatal(err)
	}
}

// median is the row of rs (one contender's rounds) with each measured
// figure the median over the rounds (the mean of the middle two for an
// even count).
func median(rs []row) row {
	m := rs[0]
	med := func(get func(r *row) *float64) {
		vs := make([]float64, len(rs))
		for i := range rs {
			vs[i] = *get(&rs[i])
		}
		slices.Sort(vs)
		v := vs[len(vs)/2]
		if len(vs)%2 == 0 {
			v = (vs[len(vs)/2-1] + v) / 2
		}
		*get(&m) = v
	}
	for _, f := range []func(r *row) *float64{
		func(r *row) *float64 { return &r.RecordsPerS },
		func(r *row) *float64 { return &r.RecordsPerSToCommit },
		func(r *row) *float64 { return &r.CPUPerM },
		func(r *row) *float64 { return &r.PeakRSS },
		func(r *row) *float64 { return &r.AllocsPerRec },
		func(r *row) *float64 { return &r.BytesPerRec },
		func(r *row) *float64 { return &r.CkptP50 },
		func(r *row) *float64 { return &r.CkptP99 },
		func(r *row) *float64 { return &r.CkptShare },
		func(r *row) *float64 { return &r.Overlapped },
		func(r *row) *float64 { return &r.BrokerCPUPerM },
		func(r *row) *float64 { return &r.MachineBusy },
		func(r *row) *float64 { return &r.LatP50 },
		func(r *row) *float64 { return &r.LatP99 },
	} {
		med(f)
	}
	m.Rounds = len(rs)
	return m
}

// throughputRun runs contender s over the n preloaded records with group
// and output topic named after id.
func throughputRun(b *testing.B, adm *kadm.Client, brokers string, brokerPID int, s spec, id string, n int) row {
	dir := b.TempDir()
	s.Brokers, s.Group, s.In, s.Out, s.State = brokers, id, input, id+"-out", filepath.Join(dir, "state")
	s.Result = filepath.Join(dir, "result.json")
	if p := os.Getenv("BENCH_PROFILE"); p != "" {
		base := filepath.Join(p, fmt.Sprintf("%s-%v", s.Name, s.Interval))
		s.CPUProf, s.AllocProf = base+".cpu.pprof", base+".allocs.pprof"
	}
	if p := os.Getenv("BENCH_TRACE"); p != "" {
		s.Trace = filepath.Join(p, fmt.Sprintf("%s-%v.trace", s.Name, s.Interval))
	}
	createTopics(b, adm, s.Out)
	defer deleteTopics(b, adm, s.Group)
	pid, stop := startContender(b, s)
	deadline := time.Now().Add(5 * time.Minute)
	// The steady part of the run: from the first offsets committed (the
	// first epoch) to the last.
	var steady struct {
		at          time.Time
		broker      float64
		busy, total uint64
		sum         int64
	}
	for {
		sum, err := check.CommittedSum(context.Background(), adm, s.Group)
		if err == nil && sum >= int64(n) {
			break
		}
		if err == nil && sum > 0 && steady.at.IsZero() {
			steady.at, steady.broker, steady.sum = time.Now(), cpuSeconds(b, brokerPID), sum
			steady.busy, steady.total = machineTicks(b)
			if s.Trace != "" {
				syscall.Kill(pid, syscall.SIGUSR1)
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: group did not commit %d offsets", s.Name, n)
		}
		<-time.After(5 * time.Millisecond)
	}
	done := time.Now()
	if s.Trace != "" && !steady.at.IsZero() {
		syscall.Kill(pid, syscall.SIGUSR2)
	}
	cpu, rss := cpuSeconds(b, pid), peakRSS(b, pid)
	broker := cpuSeconds(b, brokerPID)
	busy, total := machineTicks(b)
	res := stop()
	first, last := outputSpan(b, adm, brokers, s.Out, s.EOS)
	elapsed := done.Sub(first)
	r := s.row("throughput")
	r.Records = n
	r.RecordsPerS = float64(n) / last.Sub(first).Seconds()
	r.RecordsPerSToCommit = float64(n) / elapsed.Seconds()
	r.CPUPerM = cpu / (float64(n) / 1e6)
	r.PeakRSS = rss
	r.AllocsPerRec = float64(res.Mallocs) / float64(n)
	r.BytesPerRec = float64(res.AllocBytes) / float64(n)
	r.CkptP50, r.CkptP99, r.Checkpoints = res.CheckpointP50, res.CheckpointP99, res.Checkpoints
	r.CkptShare = res.CheckpointSum / elapsed.Seconds()
	r.Overlapped = res.Overlapped / float64(n)
	if !steady.at.IsZero() && total > steady.total && int64(n) > steady.sum {
		r.BrokerCPUPerM = (broker - steady.broker) / (float64(int64(n)-steady.sum) / 1e6)
		r.MachineBusy = float64(busy-steady.busy) / float64(total-steady.total)
	}
	return r
}

// outputSpan returns the earliest produce timestamp among the first
// records of the output's partitions, and the latest among their last
// records (read_uncommitted, once the contender stopped): when the
// contender started processing, whatever its start-up took before, and
// when it produced its last output, before the commit that ended its last
// interval.
func outputSpan(b *testing.B, adm *kadm.Client, brokers, topic string, transactional bool) (first, last time.Time) {
	ends, err := adm.ListEndOffsets(context.Background(), topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		b.Fatal(err)
	}
	starts := map[int32]kgo.Offset{}
	tails := map[int32]kgo.Offset{}
	// The last record of a partition is at its end - 1, or, written in
	// transactions, at its end - 2, before the commit marker, which the
	// consumer skips.
	last1 := int64(1)
	if transactional {
		last1 = 2
	}
	lastAt := map[int32]int64{}
	for p := range int32(partitions) {
		end := ends[topic][p].Offset
		starts[p] = kgo.NewOffset().AtStart()
		tails[p] = kgo.NewOffset().At(max(0, end-64))
		lastAt[p] = end - last1
	}
	firsts := scanOutput(b, brokers, topic, starts, func(r *kgo.Record) bool { return true })
	lasts := scanOutput(b, brokers, topic, tails, func(r *kgo.Record) bool { return r.Offset >= lastAt[r.Partition] })
	for p := range int32(partitions) {
		if first.IsZero() || firsts[p].Before(first) {
			first = firsts[p]
		}
		if lasts[p].After(last) {
			last = lasts[p]
		}
	}
	return first, last
}

// scanOutput reads each partition of topic from its offset in from until
// done says a record is its partition's last to read, and returns the
// latest timestamp read of each partition.
func scanOutput(b *testing.B, brokers, topic string, from map[int32]kgo.Offset, done func(*kgo.Record) bool) map[int32]time.Time {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.FetchMaxBytes(1<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	latest := map[int32]time.Time{}
	finished := map[int32]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(finished) < len(from) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if finished[r.Partition] {
				return
			}
			if r.Timestamp.After(latest[r.Partition]) {
				latest[r.Partition] = r.Timestamp
			}
			if done(r) {
				finished[r.Partition] = true
			}
		})
	}
	if len(finished) < len(from) {
		b.Fatalf("%s: read %d of %d partitions' output", topic, len(finished), len(from))
	}
	return latest
}

// latencyRound measures the kept latency contenders of one round, each on
// a broker of its own. On the throughput broker, which by then had taken
// tens of millions of records into topics since deleted, the raw
// transactional loop's p99 at 50 ms grew from round to round of a full
// run (54.0, 82.8, 102.6 ms on 2026-12-06 06:14) where it stays at 54-56
// ms with few throughput contenders before it: the rows measured the
// broker's past rather than the contenders. A broker for the round
// (2026-12-06 07:59 to 08:46) still gave the later rows, Sluice's, a
// broker with some 4M records behind it; a broker for each row gives
// every contender the same start.
func latencyRound(b *testing.B, round int, keep func(spec) bool, lats map[int][]row) {
	for i, s := range latencyContenders {
		if !keep(s) {
			continue
		}
		r := latencyOnItsBroker(b, s, fmt.Sprintf("lat%d-r%d", i, round))
		b.Logf("round %d latency %s/%v: p50 %.1f ms p99 %.1f ms (%d of %d records)", round, s.Name, s.Interval, r.LatP50, r.LatP99, r.Received, r.Produced)
		lats[i] = append(lats[i], r)
	}
}

// latencyOnItsBroker is latencyRun on a broker started for it.
func latencyOnItsBroker(b *testing.B, s spec, id string) row {
	brokers, _, stop := startBroker(b, "")
	defer stop()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	return latencyRun(b, kadm.NewClient(cl), brokers, s, id)
}

// latencyRun runs contender s on fresh topics and measures end-to-end
// latency at 20,000 records/s for 5 s, or 20 intervals if longer: p99 is
// the first 1 % of each epoch's records, so with 5 epochs of 1 s it was
// the worst of five commits, and moved by 10 ms from round to round.
func latencyRun(b *testing.B, adm *kadm.Client, brokers string, s spec, id string) row {
	const rate = 20000
	duration := max(5*time.Second, 20*s.Interval)
	dir := b.TempDir()
	s.Brokers, s.Group, s.In, s.Out, s.State = brokers, id, id+"-in", id+"-out", filepath.Join(dir, "state")
	s.Result = filepath.Join(dir, "result.json")
	createTopics(b, adm, s.In, s.Out)
	defer deleteTopics(b, adm, s.Group)
	_, stop := startContender(b, s)
	lat, produced := measureLatencyOn(b, brokers, s.In, s.Out, rate, duration)
	stop()
	if len(lat) == 0 {
		b.Fatalf("%s: no output", s.Name)
	}
	slices.Sort(lat)
	r := s.row("latency")
	r.Rate, r.Received, r.Produced = rate, len(lat), produced
	r.LatP50 = float64(lat[len(lat)/2].Microseconds()) / 1000
	r.LatP99 = float64(lat[len(lat)*99/100].Microseconds()) / 1000
	return r
}

func cpuModel() string {
	raw, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return ""
}
