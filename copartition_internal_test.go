package sluice

import (
	"context"
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

// A topic one offset short of its known end is behind when it was fetched
// and never seen written in a transaction (the offset is a record), and not
// when a transactional record of it was fetched (the offset may be a
// commit marker, even after a plain record), nor before any record was
// fetched.
func TestBehindOneShort(t *testing.T) {
	plain := &kgo.Record{}
	for _, tt := range []struct {
		name   string
		ci     coInput
		short  int64 // offsets between the task's next and the high-water mark
		behind bool
	}{
		{"caught up", coInput{fetched: true}, 0, false},
		{"one record short", coInput{fetched: true}, 1, true},
		{"nothing fetched yet", coInput{}, 1, false},
		{"one short after a transaction: its marker", coInput{fetched: true, txn: true}, 1, false},
		{"two short after a transaction", coInput{fetched: true, txn: true}, 2, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ci := tt.ci
			ci.hwm = 5 + tt.short
			tk := &task{next: map[string]int64{"a": 5}, co: map[string]*coInput{"a": &ci}}
			if got := tk.behind("a"); got != tt.behind {
				t.Fatalf("behind = %v, want %v", got, tt.behind)
			}
		})
	}
	// saw: plain records make the topic fetched; txn, once set, stays.
	var ci coInput
	ci.saw(nil)
	if ci.fetched {
		t.Fatal("an empty fetch counted as fetched")
	}
	ci.saw([]*kgo.Record{plain})
	if !ci.fetched || ci.txn {
		t.Fatalf("after a plain record: %+v", ci)
	}
	ci.txn = true // as after a transactional record (kgo sets the attribute)
	ci.saw([]*kgo.Record{plain})
	if !ci.txn {
		t.Fatal("a plain record cleared txn")
	}
}

// saw tells the records of a topic written in a transaction from plain
// ones, as a read_committed consumer fetches them from a broker.
func TestSawTellsTransactionalRecords(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "plain", "txn"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.ProduceSync(ctx, &kgo.Record{Topic: "plain", Value: []byte("p")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	tx, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("saw"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	if err := tx.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := tx.ProduceSync(ctx, &kgo.Record{Topic: "txn", Value: []byte("t")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"plain", "txn"} {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		if err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for len(recs) == 0 {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				t.Fatalf("%s: no record fetched: %v", topic, err)
			}
			recs = append(recs, fs.Records()...)
		}
		cl.Close()
		var ci coInput
		ci.saw(recs)
		if !ci.fetched || ci.txn != (topic == "txn") {
			t.Errorf("%s: fetched %v, txn %v", topic, ci.fetched, ci.txn)
		}
	}
}
