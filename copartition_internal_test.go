package sluice

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/txsink"
)

// clientOnly is a session of which processMerged uses only the client.
type clientOnly struct {
	txsink.Session
	cl *kgo.Client
}

func (s clientOnly) Client() *kgo.Client { return s.cl }

// processMerged, a replay of a refused commit (replayUntil) stopping
// while the merge waits for a topic: every topic is fetched again from its
// first record not taken, not from where the merge held it back. (Found by
// review: the records in between were skipped.)
func TestMergedStopRefetchesWhatItDidNotTake(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	p, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	base := time.UnixMilli(1_700_000_000_000)
	ms := func(n int) time.Time { return base.Add(time.Duration(n) * time.Millisecond) }
	var recs []*kgo.Record
	for i := range 5 { // a@0..4: ts 2,4,6,8,10
		recs = append(recs, &kgo.Record{Topic: "a", Value: []byte{'a', byte('0' + i)}, Timestamp: ms(2 + 2*i)})
	}
	recs = append(recs, &kgo.Record{Topic: "b", Value: []byte("b0"), Timestamp: ms(1)}, &kgo.Record{Topic: "b", Value: []byte("b1"), Timestamp: ms(5)})
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("a", "b"), kgo.ConsumerGroup("g"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string][]*kgo.Record{}
	var fs kgo.Fetches
	for len(got["a"]) < 5 || len(got["b"]) < 2 {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		f := cl.PollFetches(pctx)
		timedOut := pctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatal("poll timed out")
		}
		f.EachRecord(func(r *kgo.Record) { got[r.Topic] = append(got[r.Topic], r) })
		fs = append(fs, f...)
	}

	in := &Instance{cfg: Options{InputTopics: []string{"a", "b"}}}
	in.m, _ = newMetrics(in)
	l := &loop{in: in, sess: clientOnly{cl: cl}, tasks: map[int32]*task{}, coord: barrier.New(barrier.Config{Interval: time.Hour, Timeout: time.Second, TolerableFailures: 1}, time.Now(), 1)}
	tk := &task{p: 0, committed: map[string]int64{"a": 0, "b": 0}, next: map[string]int64{"a": 0, "b": 0},
		// the refused attempt ended at b@0 (and a@0): the replay stops there
		replayUntil: map[string]int64{"a": 0, "b": 0},
		co:          map[string]*coInput{"a": {hwm: 5}, "b": {hwm: 10}}} // b: more on the broker
	l.tasks[0] = tk
	if err := l.processMerged(fs); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	next := cl.PollFetches(pctx)
	first := map[string]int64{}
	next.EachRecord(func(r *kgo.Record) {
		if _, ok := first[r.Topic]; !ok {
			first[r.Topic] = r.Offset
		}
	})
	if first["a"] != 0 {
		t.Errorf("topic a refetched from %d, task's next is 0: records a@0..a@%d skipped", first["a"], first["a"]-1)
	}
}
