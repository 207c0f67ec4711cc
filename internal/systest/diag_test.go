package systest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/check"
)

// dumpMarkers logs, as evidence for a failed exactly-once check, the last
// epoch markers of every changelog partition as a read_committed reader
// sees them; their offsets must agree with the group's committed ones,
// which dumpGroup logs.
func dumpMarkers(t *testing.T, brokers, app string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(changelog.TopicName(app)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	last := map[int32][]string{}
	idle := time.Now()
	for time.Since(idle) < 2*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			idle = time.Now()
			if !changelog.IsMarker(r.Key) {
				return
			}
			m, _ := changelog.DecodeMarker(r.Value)
			s := append(last[r.Partition], fmt.Sprintf("marker@%d epoch %d next %v", r.Offset, m.Epoch, m.Offsets))
			if len(s) > 3 {
				s = s[1:]
			}
			last[r.Partition] = s
		})
	}
	t.Logf("last markers per changelog partition: %v", last)
}

// dumpEchoGaps logs, for each partition whose echo output misses inputs,
// which inputs are missing from what a fresh read_committed reader finds
// (by value, whatever the order), and where the partition's output begins
// (its first records, their offsets, and the log start): the order-strict
// check.Echo counts a whole partition lost when its first input is, so
// this says whether a few inputs were lost or the reader missed some.
func dumpEchoGaps(t *testing.T, brokers string, f *feeder) {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 10*time.Second, nil)
	if err != nil {
		t.Logf("echo gaps: read: %v", err)
		return
	}
	byPartition := map[int32][]*kgo.Record{}
	for _, r := range recs {
		byPartition[r.Partition] = append(byPartition[r.Partition], r)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	starts, err := kadm.NewClient(cl).ListStartOffsets(context.Background(), output)
	if err != nil {
		t.Logf("echo gaps: log start offsets: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, in := range f.raw {
		seen := map[string]bool{}
		for _, r := range byPartition[p] {
			seen[string(r.Key)+"="+string(r.Value)] = true
		}
		var missing []int
		for i, v := range in {
			if !seen[string(v)] {
				missing = append(missing, i)
			}
		}
		if len(missing) == 0 {
			continue
		}
		var first []string
		for _, r := range byPartition[p][:min(3, len(byPartition[p]))] {
			first = append(first, fmt.Sprintf("%s=%s@%d", r.Key, r.Value, r.Offset))
		}
		start, _ := starts.Lookup(output, p)
		t.Logf("echo gaps: partition %d: %d of %d inputs missing, the first at input indexes %v; %d outputs, the first %v; log start %d",
			p, len(missing), len(in), missing[:min(10, len(missing))], len(byPartition[p]), first, start.Offset)
	}
}

// dumpGroup logs, for a run whose outputs fell short, who holds what: each
// member of the group with its assignment (under KIP-848 its target too,
// and its epoch), and how far the group's committed offsets are behind the
// input's end. A partition assigned to a live member and not moving says
// the member stopped processing it; one assigned to nobody, or only as a
// target, says the group did not hand it over.
func dumpGroup(t *testing.T, brokers, app string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Logf("group %s: %v", app, err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := func(id *string, member string) string {
		if id != nil {
			return *id
		}
		return member
	}
	if gs, err := adm.DescribeConsumerGroups(ctx, app); err == nil && gs[app].Err == nil && len(gs[app].Members) > 0 {
		g := gs[app]
		t.Logf("group %s (KIP-848): state %s, epoch %d, assignment epoch %d", app, g.State, g.Epoch, g.AssignmentEpoch)
		for _, m := range g.Members {
			t.Logf("  member %s epoch %d: assigned %v, target %v", name(m.InstanceID, m.MemberID), m.MemberEpoch, m.Assignment.Sorted(), m.TargetAssignment.Sorted())
		}
	} else if gs, err := adm.DescribeGroups(ctx, app); err == nil {
		g := gs[app]
		t.Logf("group %s (classic): state %s, protocol %s", app, g.State, g.Protocol)
		for _, m := range g.Members {
			var assigned any = "?"
			if a, ok := m.Assigned.AsConsumer(); ok {
				assigned = a.Topics
			}
			t.Logf("  member %s: assigned %v", name(m.InstanceID, m.MemberID), assigned)
		}
	} else {
		t.Logf("group %s: describe: %v", app, err)
	}
	dumpOffsets(t, ctx, adm, app)
	dumpTransactions(t, ctx, adm)
}

// dumpOffsets logs how far the group's committed offsets are behind the
// end of each topic it consumes (the input; a pipeline's repartition topic
// too), or that of the input where it has committed none.
func dumpOffsets(t *testing.T, ctx context.Context, adm *kadm.Client, app string) {
	t.Helper()
	offs, err := adm.FetchOffsets(ctx, app)
	if err != nil {
		t.Logf("group %s: committed offsets: %v", app, err)
		return
	}
	topics := offs.Offsets().TopicsSet().Topics()
	if len(topics) == 0 {
		topics = []string{input}
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Logf("group %s: end offsets of %v: %v", app, topics, err)
		return
	}
	ends.Each(func(e kadm.ListedOffset) {
		committed := "none"
		if o, ok := offs.Lookup(e.Topic, e.Partition); ok {
			committed = fmt.Sprint(o.At)
		}
		t.Logf("  %s/%d: committed %s, end %d", e.Topic, e.Partition, committed, e.Offset)
	})
}

// dumpTransactions logs the transactions still open on the broker. One
// holds back every read_committed reader of the partitions it wrote to,
// and, if it committed offsets for the group, a new owner's offset fetch
// (UNSTABLE_OFFSET_COMMIT; kfake answers it for the whole group while any
// of its transactions has offsets pending).
func dumpTransactions(t *testing.T, ctx context.Context, adm *kadm.Client) {
	t.Helper()
	txns, err := adm.DescribeTransactions(ctx)
	if err != nil {
		t.Logf("transactions: %v", err)
		return
	}
	for _, d := range txns.Sorted() {
		if d.State == "Empty" || d.State == "CompleteCommit" || d.State == "CompleteAbort" || d.State == "Dead" {
			continue
		}
		open := "?"
		if d.StartTimestamp > 0 {
			open = time.Since(time.UnixMilli(d.StartTimestamp)).Round(time.Millisecond).String()
		}
		t.Logf("  transaction %s: %s for %s (timeout %d ms), partitions %v", d.TxnID, d.State, open, d.TimeoutMillis, d.Topics.Sorted())
	}
}
