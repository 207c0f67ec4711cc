// Package check verifies a job's committed output against its input the
// way an outside reader would: with a read_committed consumer. The demo and
// the crash tests use it; it knows the built-in jobs' contracts.
package check

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadCommitted reads topic from the start with isolation.level
// read_committed until done reports true for the records read so far, or
// nothing new arrives for idle, or ctx ends. opts are added to the
// reader's (TLS, SASL).
func ReadCommitted(ctx context.Context, brokers []string, topic string, idle time.Duration, done func([]*kgo.Record) bool, opts ...kgo.Opt) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	last := time.Now()
	for {
		if done != nil && done(out) {
			return out, nil
		}
		if time.Since(last) > idle {
			return out, nil
		}
		pctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return out, ferr
		}
		n := len(out)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
		if len(out) > n {
			last = time.Now()
		}
	}
}

// ReadToEnd reads topic from the start to where its partitions end when it
// is called, at isolation level level: their high-water marks reading
// uncommitted, their last stable offsets reading committed. It returns the
// data records below those ends, in partition order, then offset order.
// Unlike a reader that stops once nothing new arrives for a while, it
// cannot stop early on a busy machine: it reads control records too (the
// commit and abort markers, which it drops), so it knows when it reached
// each partition's end. That needs the offset below each end to be
// readable: reading committed, a marker or a record outside transactions,
// which holds when the partition's transactions do not interleave (one
// transactional producer writes it, as an instance writes its outputs);
// and in the log, not removed by retention or compaction. Otherwise the
// read lasts until ctx ends.
func ReadToEnd(ctx context.Context, brokers []string, topic string, level kgo.IsolationLevel) ([]*kgo.Record, error) {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	list := adm.ListEndOffsets
	if level == kgo.ReadCommitted() {
		list = adm.ListCommittedOffsets
	}
	ends, err := list(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list the ends of %s: %w", topic, err)
	}
	end := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			end[o.Partition] = o.Offset
			from[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(from) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(level),
		kgo.KeepControlRecords(),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	left := maps.Clone(end) // the partitions not read to their end yet
	var out []*kgo.Record
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read %s: %w: partitions %v not read to their end", topic, err, slices.Sorted(maps.Keys(left)))
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err)) })
		if ferr != nil {
			return nil, fmt.Errorf("read %s: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset+1 >= end[r.Partition] {
				delete(left, r.Partition)
			}
			if r.Attrs.IsControl() || r.Offset >= end[r.Partition] {
				return // a marker, or written after the ends were listed
			}
			out = append(out, r)
		})
	}
	slices.SortStableFunc(out, func(a, b *kgo.Record) int { return int(a.Partition - b.Partition) })
	return out, nil
}

// Aggregation mirrors the aggregate job's output value.
type Aggregation struct {
	Count int64 `json:"count"`
	Sum   int64 `json:"sum"`
	Min   int64 `json:"min"`
	Max   int64 `json:"max"`
}

// Report counts what a check found.
type Report struct {
	Inputs     int // valid inputs
	Outputs    int // output records read
	Duplicates int // outputs for an input already reflected
	Lost       int // inputs with no output
	Wrong      int // outputs whose value is not the expected running aggregation
}

// OK reports whether the output was exactly once and correct.
func (r Report) OK() bool { return r.Duplicates == 0 && r.Lost == 0 && r.Wrong == 0 }

func (r Report) String() string {
	return fmt.Sprintf("%d inputs, %d outputs, %d duplicates, %d lost, %d wrong", r.Inputs, r.Outputs, r.Duplicates, r.Lost, r.Wrong)
}

// Aggregate checks the aggregate job: inputs are each key's valid values in
// the order they were produced (one key lives in one partition, so that is
// processing order), outputs the output records. Every input must be
// reflected by exactly one output carrying the running aggregation up to
// and including it.
func Aggregate(inputs map[string][]int64, outputs []*kgo.Record) Report {
	var rep Report
	byKey := map[string][]Aggregation{}
	for _, r := range outputs {
		var a Aggregation
		if err := json.Unmarshal(r.Value, &a); err != nil {
			rep.Wrong++
			continue
		}
		byKey[string(r.Key)] = append(byKey[string(r.Key)], a)
	}
	rep.Outputs = len(outputs)
	for key, vals := range inputs {
		rep.Inputs += len(vals)
		want := Running(vals)
		seen := 0
		for _, got := range byKey[key] {
			switch {
			case got.Count >= 1 && got.Count <= int64(seen):
				rep.Duplicates++
			case got.Count == int64(seen)+1 && got == want[seen]:
				seen++
			default:
				rep.Wrong++
			}
		}
		rep.Lost += len(vals) - seen
		delete(byKey, key)
	}
	for _, extra := range byKey {
		rep.Wrong += len(extra)
	}
	return rep
}

// Running returns the aggregate job's running aggregation of vals, one a
// value: what its outputs for a key carry, the last one what its state
// holds.
func Running(vals []int64) []Aggregation {
	out := make([]Aggregation, len(vals))
	var acc Aggregation
	for i, v := range vals {
		if i == 0 {
			acc.Min, acc.Max = v, v
		}
		acc.Count++
		acc.Sum += v
		acc.Min, acc.Max = min(acc.Min, v), max(acc.Max, v)
		out[i] = acc
	}
	return out
}

// WordCount checks the wordcount job: words are each word's occurrences
// in the input, outputs the output records (key = word, value = the running
// count as base-10 text). Every occurrence must be reflected by exactly one
// output, and each word's outputs must count 1, 2, … in order.
func WordCount(words map[string]int, outputs []*kgo.Record) Report {
	rep := Report{Outputs: len(outputs)}
	seen := map[string]int{}
	for _, r := range outputs {
		w := string(r.Key)
		n, err := strconv.Atoi(string(r.Value))
		switch {
		case err != nil || words[w] == 0 || n > words[w]:
			rep.Wrong++
		case n <= seen[w]:
			rep.Duplicates++
		case n == seen[w]+1:
			seen[w] = n
		default:
			rep.Wrong++ // a count skipped: reported as lost below too
		}
	}
	for w, n := range words {
		rep.Inputs += n
		rep.Lost += n - seen[w]
	}
	return rep
}

// Echo checks the echo job: every output partition must equal its input
// partition, record for record, in order.
func Echo(inputs, outputs map[int32][][]byte) Report {
	var rep Report
	for p, in := range inputs {
		out := outputs[p]
		rep.Inputs += len(in)
		rep.Outputs += len(out)
		i, j := 0, 0
		for j < len(out) {
			switch {
			case i < len(in) && string(out[j]) == string(in[i]):
				i++
			case i > 0 && indexOf(in[:i], out[j]) >= 0:
				rep.Duplicates++
			default:
				rep.Wrong++
			}
			j++
		}
		rep.Lost += len(in) - i
	}
	for p, out := range outputs {
		if _, ok := inputs[p]; !ok {
			rep.Outputs += len(out)
			rep.Wrong += len(out)
		}
	}
	return rep
}

func indexOf(vs [][]byte, v []byte) int {
	for i := len(vs) - 1; i >= 0; i-- {
		if string(vs[i]) == string(v) {
			return i
		}
	}
	return -1
}

// Settled is a ReadCommitted condition: at least want records, then no new
// one for half a second on the same warm reader, so that a duplicate
// arriving after the expected count is still seen. (A second, fresh reader
// with a short idle limit can give up before its first fetch on a busy
// machine and report records as lost.)
func Settled(want int) func([]*kgo.Record) bool {
	n := -1
	var since time.Time
	return func(r []*kgo.Record) bool {
		switch {
		case len(r) < want:
			return false
		case len(r) != n:
			n, since = len(r), time.Now()
			return false
		}
		return time.Since(since) >= 500*time.Millisecond
	}
}

// OpenTransactions returns the partitions of topics whose last stable
// offset is below their high-water mark: a transaction is open on them.
// Once every producer stopped cleanly, there must be none.
func OpenTransactions(ctx context.Context, brokers []string, topics ...string) (map[string][]int32, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	hwm, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, err
	}
	lso, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return nil, err
	}
	open := map[string][]int32{}
	var ferr error
	hwm.Each(func(h kadm.ListedOffset) {
		if h.Err != nil {
			ferr = h.Err
			return
		}
		l, ok := lso.Lookup(h.Topic, h.Partition)
		if !ok || l.Err != nil {
			ferr = fmt.Errorf("no last stable offset for %s/%d", h.Topic, h.Partition)
			return
		}
		if l.Offset < h.Offset {
			open[h.Topic] = append(open[h.Topic], h.Partition)
		}
	})
	return open, ferr
}

// MetricSum sums the values of every series of the counter or gauge name in
// reg (0 when it has none) whose labels match labels, pairs of label name
// and value: MetricSum(reg, "sluice_tasks", "state", "running").
func MetricSum(reg prometheus.Gatherer, name string, labels ...string) (float64, error) {
	mfs, err := reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum, err
}

// hasLabels reports whether m has every label of pairs (name, value, …).
func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
			return l.GetName() == pairs[i] && l.GetValue() == pairs[i+1]
		}) {
			return false
		}
	}
	return true
}

// CommittedSum is the sum of group's committed offsets over every
// partition: how many input records its members have committed past.
func CommittedSum(ctx context.Context, adm *kadm.Client, group string) (int64, error) {
	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return 0, err
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) { sum += max(o.At, 0) })
	return sum, nil
}
