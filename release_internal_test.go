package sluice

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/kstate"
)

// A revoke handled in the poll that gave a task with no committed offset
// its first records: the release drops the poll's records, so they must
// come again from the first, for that task and for a partition whose task
// does not run (its pause took hold late). At-least-once, the abort's
// rewind went to the tasks' and the group's committed offsets only, which
// have none for either, and the consumer stayed past them: a chaos run
// lost the first 120 inputs of a partition. The session now rewinds such
// a partition to where consuming began, as franz-go's transactional one
// always did; the test holds for both.
func TestReleaseRefetchesAFreshTasksFirstRecords(t *testing.T) {
	for _, tc := range []struct {
		name string
		g    Guarantee
	}{{"at-least-once", AtLeastOnce}, {"exactly-once", ExactlyOnce}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "in"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			produce := func(n int) {
				t.Helper()
				var recs []*kgo.Record
				for i := range n {
					for p := range int32(3) {
						recs = append(recs, &kgo.Record{Topic: "in", Partition: p, Value: []byte(strconv.Itoa(i))})
					}
				}
				if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			produce(10)

			in, err := New(Options{Brokers: c.ListenAddrs(), AppID: "rel", InstanceID: "i", InputTopics: []string{"in"},
				Job: Job{Name: "noop", Process: func(Context, *Record) error { return nil }}, StateDir: t.TempDir(),
				Backend: kstate.MemoryBackend, Registry: prometheus.NewRegistry(), Guarantee: tc.g})
			if err != nil {
				t.Fatal(err)
			}
			in.batchMax = 1 << 20
			sess, err := in.newSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			cl := sess.Client()
			// pollUntil polls as the loop does (the assignment pauses the
			// partitions; they are resumed as an installed task's are)
			// until the polls held records of partitions 0 and 2.
			pollUntil := func() kgo.Fetches {
				t.Helper()
				var all kgo.Fetches
				deadline := time.Now().Add(time.Minute)
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					fs := sess.PollRecords(ctx, 1000)
					cancel()
					for _, ev := range in.takeEvents() {
						if ev.kind == "assigned" {
							cl.ResumeFetchPartitions(ev.parts)
						}
					}
					sess.AllowRebalance()
					all = append(all, fs...)
					got := map[int32]bool{}
					all.EachPartition(func(ftp kgo.FetchTopicPartition) {
						got[ftp.Partition] = got[ftp.Partition] || len(ftp.Records) > 0
					})
					if got[0] && got[2] {
						return all
					}
				}
				t.Fatal("no records of partitions 0 and 2 within a minute")
				return nil
			}
			fs := pollUntil()

			l := &loop{in: in, ctx: context.Background(), sess: sess, coord: barrier.New(in.cfg.Checkpoint, time.Now(), 1),
				tasks: map[int32]*task{}, restoring: map[int32]*restoreJob{}, owned: map[int32]map[string]bool{}}
			l.outPromise, l.plainPromise = l.outPromised, l.plainPromised
			for p := range int32(2) {
				tk, err := newTask(in, p, kstate.NewMemory(), kstate.Meta{})
				if err != nil {
					t.Fatal(err)
				}
				l.tasks[p] = tk
			}
			if err := l.run(l.coord.SetTasks(l.taskList())); err != nil {
				t.Fatal(err)
			}
			rest, err := l.handleEvents([]event{{kind: "revoked", tasks: []int32{1}, parts: map[string][]int32{"in": {1}}, serial: in.session.Load()}}, fs)
			if err != nil {
				t.Fatal(err)
			}
			if len(rest) != 0 {
				t.Fatalf("the poll's records were kept after the release: %d fetches", len(rest))
			}
			if l.tasks[1] != nil || l.tasks[0] == nil {
				t.Fatalf("tasks after revoking 1: %v", l.taskList())
			}

			produce(10) // so that a consumer left past the first 10 gets records too
			first := firstOffsets(pollUntil())
			for _, p := range []int32{0, 2} {
				if at, ok := first["in"][p]; !ok || at.Offset != 0 {
					t.Fatalf("partition %d's records came again from offset %d, want 0 (the first, dropped by the release)", p, at.Offset)
				}
			}
		})
	}
}
