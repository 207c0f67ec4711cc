package sluice

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	joinCtx, cancelJoin := context.WithTimeout(ctx, time.Minute) // the group's join included
	defer cancelJoin()
	for len(got["a"]) < 5 || len(got["b"]) < 2 {
		f := cl.PollFetches(joinCtx)
		if joinCtx.Err() != nil {
			t.Fatal("not every record polled within a minute")
		}
		f.EachRecord(func(r *kgo.Record) { got[r.Topic] = append(got[r.Topic], r) })
		fs = append(fs, f...)
	}

	in := &Instance{cfg: Options{InputTopics: []string{"a", "b"}, MaxTaskIdle: DefaultMaxTaskIdle}}
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
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	first := map[string]int64{}
	for _, ok := first["a"]; !ok; _, ok = first["a"] {
		next := cl.PollFetches(pctx)
		if pctx.Err() != nil {
			t.Fatal("topic a not fetched again within a minute")
		}
		next.EachRecord(func(r *kgo.Record) {
			if _, ok := first[r.Topic]; !ok {
				first[r.Topic] = r.Offset
			}
		})
	}
	if first["a"] != 0 {
		t.Errorf("topic a refetched from %d, task's next is 0: records a@0..a@%d skipped", first["a"], first["a"]-1)
	}
}

// merged holds the other topics back while one that ran out in the poll
// still has records on the broker, for at most Options.MaxTaskIdle; a
// negative MaxTaskIdle never holds them back.
func TestMergedHoldsBackForMaxTaskIdle(t *testing.T) {
	rec := func(topic string, offset, ts int64) *kgo.Record {
		return &kgo.Record{Topic: topic, Offset: offset, Timestamp: time.UnixMilli(ts)}
	}
	for _, tt := range []struct {
		name    string
		idle    time.Duration
		waiting time.Duration // how long topic a has been waited for, when the poll has none of it
		taken   []string
		rest    map[string]int64
	}{
		{"a lagging topic holds the other back", DefaultMaxTaskIdle, 0, []string{"a0", "b0", "a1"}, map[string]int64{"b": 1}},
		{"until it passed", DefaultMaxTaskIdle, 2 * time.Second, []string{"b0", "b1", "b2"}, map[string]int64{}},
		{"a longer MaxTaskIdle", time.Minute, 2 * time.Second, nil, map[string]int64{"b": 0}},
		{"a negative MaxTaskIdle never holds back", -1, 0, []string{"a0", "b0", "a1", "b1", "b2"}, map[string]int64{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := &loop{in: &Instance{cfg: Options{InputTopics: []string{"a", "b"}, MaxTaskIdle: tt.idle}}}
			// a: 10 records on the broker, b: 3; neither read yet.
			tk := &task{next: map[string]int64{"a": -1, "b": -1}, co: map[string]*coInput{"a": {hwm: 10}, "b": {hwm: 3}}}
			byTopic := map[string][]*kgo.Record{"b": {rec("b", 0, 2), rec("b", 1, 4), rec("b", 2, 6)}}
			if tt.waiting > 0 {
				tk.co["a"].waitingSince = time.Now().Add(-tt.waiting)
			} else {
				byTopic["a"] = []*kgo.Record{rec("a", 0, 1), rec("a", 1, 3)}
			}
			out, rest := l.merged(tk, byTopic)
			var taken []string
			for _, r := range out {
				taken = append(taken, r.Topic+strconv.FormatInt(r.Offset, 10))
			}
			if !slices.Equal(taken, tt.taken) {
				t.Errorf("took %v, want %v", taken, tt.taken)
			}
			if !maps.Equal(rest, tt.rest) {
				t.Errorf("fetched again from %v, want %v", rest, tt.rest)
			}
		})
	}
}

// New fills in MaxTaskIdle's default: a zero value holds a lagging topic's
// partners back for DefaultMaxTaskIdle, not never.
func TestNewFillsMaxTaskIdle(t *testing.T) {
	job := Job{Name: "j", Process: func(Context, *Record) error { return nil }}
	for _, tt := range []struct{ set, want time.Duration }{
		{0, DefaultMaxTaskIdle},
		{-1, -1},
		{time.Minute, time.Minute},
	} {
		in, err := New(Options{Brokers: []string{"127.0.0.1:1"}, AppID: "a", InstanceID: "i", Job: job,
			InputTopics: []string{"a", "b"}, StateDir: t.TempDir(), MaxTaskIdle: tt.set, Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		if in.cfg.MaxTaskIdle != tt.want {
			t.Errorf("Options.MaxTaskIdle %v: the instance holds topics back for %v, want %v", tt.set, in.cfg.MaxTaskIdle, tt.want)
		}
		if err := in.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A topic is behind while the task is short of its known end: at its next
// offset, or, once it took every data record fetched, at the end of what
// the fetches brought (markers and aborted records after the data).
func TestBehind(t *testing.T) {
	for _, tt := range []struct {
		name              string
		next              int64
		dataTo, fetchedTo int64
		behind            bool
	}{
		{"caught up", 10, 10, 10, false},
		{"one record short", 9, 9, 9, true},
		{"one record short, nothing fetched yet", 9, 0, 0, true},
		{"its commit marker after it", 9, 9, 10, false},
		{"a commit marker, aborted records and an abort marker after it", 5, 5, 10, false},
		{"the markers fetched, a data record before them not taken", 4, 5, 10, true},
		{"markers only, from its committed offset", 8, 0, 10, false},
		{"markers fetched short of the end", 5, 5, 8, true},
		{"no offset known, nothing fetched", -1, 0, 0, true},
		{"no offset known, markers only fetched", -1, 0, 10, false},
		{"no offset known, data fetched", -1, 3, 10, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ci := coInput{hwm: 10, dataTo: tt.dataTo, fetchedTo: tt.fetchedTo}
			tk := &task{next: map[string]int64{"a": tt.next}, co: map[string]*coInput{"a": &ci}}
			if tt.next < 0 {
				tk.next = map[string]int64{} // neither next nor committed
			}
			if got := tk.behind("a"); got != tt.behind {
				t.Fatalf("behind = %v, want %v", got, tt.behind)
			}
		})
	}
}

// Once the task took every data record fetched, its next offset moves past
// the markers after them, where the consumer is; not while a data record
// is left, nor past the end of a replay.
func TestSkipMarkers(t *testing.T) {
	for _, tt := range []struct {
		name              string
		next, until       int64 // until < 0: no replay
		dataTo, fetchedTo int64
		want              int64
	}{
		{"markers after the data", 5, -1, 5, 8, 8},
		{"a data record not taken", 4, -1, 5, 8, 4},
		{"nothing after the data", 5, -1, 5, 5, 5},
		{"a replay ending before the markers' end", 5, 6, 5, 8, 5},
		{"a replay ending after them", 5, 9, 5, 8, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tk := &task{next: map[string]int64{"a": tt.next}, co: map[string]*coInput{"a": {dataTo: tt.dataTo, fetchedTo: tt.fetchedTo}}}
			if tt.until >= 0 {
				tk.replayUntil = map[string]int64{"a": tt.until}
			}
			tk.skipMarkers("a")
			if got := tk.next["a"]; got != tt.want {
				t.Fatalf("next = %d, want %d", got, tt.want)
			}
		})
	}
}

// noteFetched drops the markers of what a read_committed consumer that keeps
// control records fetches from a broker, and notes where the data and the
// fetch end: after a committed transaction, an aborted one (its records
// left out by the consumer) and a plain record.
func TestNoteFetchedDropsMarkers(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("note"), kgo.DefaultProduceTopic("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	for _, end := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort} {
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := tx.ProduceSync(ctx, kgo.StringRecord(fmt.Sprint(end)), kgo.StringRecord(fmt.Sprint(end))).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	// Offsets: 0, 1 committed; 2 its marker; 3, 4 aborted; 5 the abort
	// marker. Then a plain record, 6, and the end, 7.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("a"), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var ci coInput
	var data []int64
	for ci.fetchedTo < 6 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("fetched to %d: %v", ci.fetchedTo, err)
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range ci.noteFetched(p.Records) {
				data = append(data, r.Offset)
			}
		})
	}
	if !slices.Equal(data, []int64{0, 1}) || ci.dataTo != 2 || ci.fetchedTo != 6 {
		t.Fatalf("data %v, dataTo %d, fetchedTo %d; want [0 1], 2, 6", data, ci.dataTo, ci.fetchedTo)
	}
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.ProduceSync(ctx, kgo.StringRecord("plain")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for ci.fetchedTo < 7 {
		cl.PollFetches(ctx).EachPartition(func(p kgo.FetchTopicPartition) { ci.noteFetched(p.Records) })
		if err := ctx.Err(); err != nil {
			t.Fatalf("the plain record not fetched: %v", err)
		}
	}
	if ci.dataTo != 7 || ci.fetchedTo != 7 {
		t.Fatalf("after the plain record: dataTo %d, fetchedTo %d; want 7, 7", ci.dataTo, ci.fetchedTo)
	}
}
