package sluice

import (
	"context"
	"maps"
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
// always did; the test holds for both. It holds as well:
//   - with the epoch's transaction open: the task processed an earlier
//     poll, the release aborts the epoch through the coordinator
//     (EpochFailed), and that poll comes again with the dropped one;
//   - with two input topics, only one of which has records;
//   - with two input topics after an epoch committed the first one's
//     offsets only: the second's records, processed in the open epoch,
//     come again from its first, the first topic's from its commit;
//   - for a missed revoke: task 0 is assigned again while it runs, so it
//     is released and restored anew, then installed as the loop does.
func TestReleaseRefetchesAFreshTasksFirstRecords(t *testing.T) {
	type tcase struct {
		name   string
		g      Guarantee
		topics []string // the first has records
		open   bool     // the epoch's transaction is open at the release
		missed bool     // task 0 is assigned again (it missed its revoke), not task 1 revoked
		// committed: an epoch committed the tasks' offsets of the first
		// topic (10) before the second had records.
		committed bool
	}
	var cases []tcase
	for _, g := range []struct {
		name string
		g    Guarantee
	}{{"at-least-once", AtLeastOnce}, {"exactly-once", ExactlyOnce}} {
		cases = append(cases,
			tcase{g.name, g.g, []string{"in"}, false, false, false},
			tcase{g.name + "/transaction open", g.g, []string{"in"}, true, false, false},
			tcase{g.name + "/two topics", g.g, []string{"in", "other"}, false, false, false},
			tcase{g.name + "/two topics, one committed", g.g, []string{"in", "other"}, true, false, true},
			tcase{g.name + "/missed revoke", g.g, []string{"in"}, true, true, false})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, tc.topics...))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			// filled are the topics with records: the first, and the
			// second once an epoch committed (the committed case).
			filled := tc.topics[:1]
			produce := func(n int) {
				t.Helper()
				var recs []*kgo.Record
				for _, topic := range filled {
					for i := range n {
						for p := range int32(3) {
							recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Value: []byte(strconv.Itoa(i))})
						}
					}
				}
				if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			produce(10)

			in, err := New(Options{Brokers: c.ListenAddrs(), AppID: "rel", InstanceID: "i", InputTopics: tc.topics,
				Job: Job{Name: "noop", Process: func(Context, *Record) error { return nil }}, StateDir: t.TempDir(),
				Backend: kstate.MemoryBackend, Registry: prometheus.NewRegistry(), Guarantee: tc.g,
				// No epoch ends by itself: the release must find it open.
				Checkpoint: barrier.Config{Interval: 10 * time.Minute, Timeout: time.Minute}, TransactionTimeout: 15 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if err := in.connect(context.Background()); err != nil { // the changelog, for a restore
				t.Fatal(err)
			}
			defer in.admCl.Close()
			in.batchMax = 1 << 20
			sess, err := in.newSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			cl := sess.Client()
			// pollUntil polls as the loop does (the assignment pauses the
			// partitions; they are resumed as an installed task's are)
			// until the polls held records of partitions 0 and 2 of
			// every topic with records.
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
					got := firstOffsets(all)
					done := true
					for _, topic := range filled {
						_, p0 := got[topic][0]
						_, p2 := got[topic][2]
						done = done && p0 && p2
					}
					if done {
						return all
					}
				}
				t.Fatalf("no records of partitions 0 and 2 of %v within a minute", filled)
				return nil
			}
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
			fs := pollUntil()
			if tc.committed {
				// Tasks 0 and 1 process the first topic's records and
				// the epoch commits; then the second topic has records.
				if err := l.process(fs); err != nil {
					t.Fatal(err)
				}
				if err := l.run(l.coord.RequestCheckpoint(time.Now())); err != nil {
					t.Fatal(err)
				}
				if ph := l.coord.Phase(); ph != barrier.Processing {
					t.Fatalf("after the checkpoint the coordinator is %v, want processing", ph)
				}
				for p := range int32(2) {
					if c := l.tasks[p].committed; c["in"] != 10 || len(c) != 1 {
						t.Fatalf("task %d's committed offsets after the epoch: %v, want in at 10 only", p, c)
					}
				}
				filled = tc.topics
				produce(10)
				fs = pollUntil()
			}
			if tc.open {
				// Tasks 0 and 1 process the first poll (partition 2's
				// records are fetched again: its task does not run), and
				// the release comes in the next.
				if err := l.process(fs); err != nil {
					t.Fatal(err)
				}
				want := map[string]int64{"in": 10}
				if tc.committed {
					want = map[string]int64{"in": 20, "other": 10}
				}
				if !l.inTxn.Load() || !maps.Equal(l.tasks[0].next, want) {
					t.Fatalf("after the poll: transaction open %v, task 0 at %v, want open at %v", l.inTxn.Load(), l.tasks[0].next, want)
				}
				produce(10)
				fs = pollUntil()
			}
			ev := event{kind: "revoked", tasks: []int32{1}, parts: map[string][]int32{}, serial: in.session.Load()}
			if tc.missed {
				ev.kind, ev.tasks = "assigned", []int32{0}
			}
			for _, topic := range tc.topics {
				ev.parts[topic] = ev.tasks
			}
			rest, err := l.handleEvents([]event{ev}, fs)
			if err != nil {
				t.Fatal(err)
			}
			if len(rest) != 0 {
				t.Fatalf("the poll's records were kept after the release: %d fetches", len(rest))
			}
			if tc.missed {
				// Task 0 restores anew (its store is empty: it never
				// committed) and is installed as the loop does, which
				// resumes its partition.
				job := l.restoring[0]
				if l.tasks[0] != nil || job == nil {
					t.Fatalf("task 0 after it was assigned again: running %v, restoring %v", l.tasks[0] != nil, job != nil)
				}
				var r restoreResult
				select {
				case r = <-job.result:
				case <-time.After(time.Minute):
					t.Fatal("task 0's restore did not finish within a minute")
				}
				if r.err != nil {
					t.Fatal(r.err)
				}
				job.result <- r // for installRestored (the channel holds one)
				if err := l.installRestored(); err != nil {
					t.Fatal(err)
				}
			}
			if (l.tasks[1] != nil) != tc.missed || l.tasks[0] == nil {
				t.Fatalf("tasks after the release: %v", l.taskList())
			}

			produce(10) // so that a consumer left past the first 10 gets records too
			first := firstOffsets(pollUntil())
			for _, topic := range filled {
				for _, p := range []int32{0, 2} {
					want := int64(0) // the first, dropped by the release
					if tc.committed && topic == "in" && p == 0 {
						want = 10 // the task's commit
					}
					if at, ok := first[topic][p]; !ok || at.Offset != want {
						t.Fatalf("%s/%d's records came again from offset %d, want %d", topic, p, at.Offset, want)
					}
				}
			}
		})
	}
}
