package sluice

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/savepoint"
)

// entries is a savepoint.Source of key/value pairs.
type entries [][2][]byte

func (s entries) Scan(_ []byte, fn func(k, v []byte) error) error {
	sort.Slice(s, func(i, j int) bool { return bytes.Compare(s[i][0], s[j][0]) < 0 })
	for _, e := range s {
		if err := fn(e[0], e[1]); err != nil {
			return err
		}
	}
	return nil
}

// writeSavepoint writes a savepoint of one task per element of tasks.
func writeTestSavepoint(t *testing.T, tasks []entries) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sp")
	w, err := savepoint.Create(context.Background(), dir, savepoint.Manifest{AppID: "src", Job: "j", ChangelogTopic: "src-changelog",
		Inputs: []savepoint.Input{{Topic: "in", Partitions: int32(len(tasks))}}})
	if err != nil {
		t.Fatal(err)
	}
	for p, src := range tasks {
		if _, err := w.WriteTask(context.Background(), savepoint.Cut{Partition: int32(p), Epoch: 5, Offsets: map[string]int64{"in": 0}}, src); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A rescale places a key's timers where its state goes: a timer's record
// key is in the tail of its physical key, not in its user key.
func TestRescaleMovesTimersWithTheirKey(t *testing.T) {
	byKey := kgo.StickyKeyPartitioner(nil).ForTopic("")
	tasks := make([]entries, 2)
	for i := 0; i < 60; i++ {
		k := []byte{byte('a' + i%26), byte('a' + i/26)}
		p := byKey.Partition(&kgo.Record{Key: k}, 2)
		tasks[p] = append(tasks[p],
			[2][]byte{kstate.EncodeKey(kstate.KindKeyed, "last", k, nil), []byte("v")},
			[2][]byte{kstate.TimerKey(kstate.Timer{Domain: kstate.EventTime, At: time.UnixMilli(1000), Key: k}), nil})
	}
	sp, err := savepoint.Open(context.Background(), writeTestSavepoint(t, tasks))
	if err != nil {
		t.Fatal(err)
	}
	s := &seedSource{sp: sp, drop: map[string]bool{}, inputs: map[string]bool{"in": true}}
	stateOf, timerOf := map[string]int32{}, map[string]int32{}
	for p := int32(0); p < 8; p++ {
		err := s.scan(context.Background(), p, 8, func(k, v []byte) error {
			key, err := kstate.DecodeKey(k)
			if err != nil {
				return err
			}
			if key.Kind == kstate.KindTimer {
				tm, err := kstate.DecodeTimer(k)
				timerOf[string(tm.Key)] = p
				return err
			}
			stateOf[string(key.UserKey)] = p
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(stateOf) != 60 || len(timerOf) != 60 {
		t.Fatalf("%d states and %d timers seeded, want 60 each", len(stateOf), len(timerOf))
	}
	for k, p := range stateOf {
		if want := int32(byKey.Partition(&kgo.Record{Key: []byte(k)}, 8)); p != want || timerOf[k] != p {
			t.Errorf("key %q: state in task %d, timer in task %d, the partitioner gives %d", k, p, timerOf[k], want)
		}
	}
}

// A previous owner that read "no marker" and paused before it wrote cannot
// seed after the new owner seeded and committed an epoch: the producer it
// writes with was fenced by the new owner's. (Found by review: fencing
// with one producer and writing with another let it.)
func TestPausedSeederIsFenced(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	ctx := context.Background()
	kKey := kstate.EncodeKey(kstate.KindKeyed, "last", []byte("k"), nil)
	dir := writeTestSavepoint(t, []entries{{{kKey, []byte("savepoint")}}})
	newInst := func(id string) *Instance {
		in, err := New(Options{Brokers: brokers, AppID: "dst", InstanceID: id, InputTopics: []string{"in"},
			Job: Job{Name: "j", Process: func(Context, *Record) error { return nil }}, Backend: "memory",
			StateDir: t.TempDir(), RestoreFrom: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		if in.seed, err = in.openSeed(ctx); err != nil {
			t.Fatal(err)
		}
		if err := in.connect(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(in.admCl.Close)
		return in
	}
	a, b := newInst("A"), newInst("B")
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: "in", Partition: 0, At: 0, LeaderEpoch: -1})
	if _, err := a.adm.CommitOffsets(ctx, "dst", offs); err != nil {
		t.Fatal(err)
	}

	// A, up to its decision to seed: its producer initialised, the
	// changelog read, no marker...
	cl, err := a.seedClient(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	beA, metaA, err := a.openStore(0, false)
	if err != nil {
		t.Fatal(err)
	}
	resA, err := a.restoreStore(ctx, 0, beA, metaA)
	if err != nil || resA.Last != nil {
		t.Fatalf("A's read: %+v %v", resA, err)
	}
	// ... then it pauses. B takes the partition, seeds it and commits
	// epoch 6.
	if rb := b.restore(ctx, 0); rb.err != nil || rb.meta.Epoch != 5 {
		t.Fatalf("B's restore: epoch %d, %v", rb.meta.Epoch, rb.err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("dst-B"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	hdr := []kgo.RecordHeader{{Key: changelog.EpochHeader, Value: changelog.EncodeEpoch(6)}}
	if err := prod.ProduceSync(ctx,
		&kgo.Record{Topic: "dst-changelog", Partition: 0, Key: kKey, Value: []byte("epoch 6"), Headers: hdr},
		&kgo.Record{Topic: "dst-changelog", Partition: 0, Key: changelog.MarkerKey, Headers: hdr,
			Value: changelog.EncodeMarker(changelog.Marker{Epoch: 6, Offsets: map[string]int64{"in": 0}, Job: "j"})},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := prod.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	// A resumes where it paused.
	if err := a.seedTask(ctx, cl, 0, resA.Orphans); err == nil {
		t.Errorf("the paused previous owner seeded after the new owner's epoch 6")
	}
	restored := newInst("C")
	restored.seed = nil
	be, meta, err := restored.openStore(0, true)
	if err != nil {
		t.Fatal(err)
	}
	res, err := restored.restoreStore(ctx, 0, be, meta)
	if err != nil {
		t.Fatal(err)
	}
	v, _, _ := be.Get(kKey)
	if res.Last == nil || res.Last.Epoch != 6 || string(v) != "epoch 6" {
		t.Errorf("after restore: last marker %+v, k = %q; want epoch 6, \"epoch 6\"", res.Last, v)
	}
}

// Operator lists through a savepoint, as Flink redistributes them: a union
// list gives every task every task's elements, rescaled or not; a split
// list stays with its task, and after a rescale goes to the task of its
// writer's number modulo the new count. A task's copy of broadcast state
// comes from the old task of its number modulo the old count.
func TestSeedOperatorLists(t *testing.T) {
	entry := func(mode byte, task int32, elems ...string) [2][]byte {
		sub := []byte{mode, 0, 0, 0, byte(task)}
		var v []byte
		for _, e := range elems {
			v = append(append(v, byte(len(e))), e...)
		}
		return [2][]byte{kstate.EncodeKey(kstate.KindOperator, map[byte]string{kstate.OperatorUnion: "seen", kstate.OperatorSplit: "offsets"}[mode], nil, sub), v}
	}
	table := func(v string) [2][]byte { // a task's copy of broadcast state
		return [2][]byte{kstate.EncodeKey(kstate.KindOperator, "table", nil, []byte{kstate.OperatorBroadcast, 'k'}), append([]byte{byte(len(v))}, v...)}
	}
	dir := writeTestSavepoint(t, []entries{
		{entry(kstate.OperatorUnion, 0, "a"), entry(kstate.OperatorSplit, 0, "x"), table("t0")},
		{entry(kstate.OperatorUnion, 1, "b"), entry(kstate.OperatorSplit, 1, "y"), table("t1")},
	})
	sp, err := savepoint.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &seedSource{sp: sp, drop: map[string]bool{}, inputs: map[string]bool{"in": true}}
	seeded := func(p, parts int32) string {
		var got []string
		err := s.scan(context.Background(), p, parts, func(k, v []byte) error {
			key, err := kstate.DecodeKey(k)
			if err != nil {
				return err
			}
			got = append(got, key.Name+"="+string(v[1:]))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(got)
		return strings.Join(got, " ")
	}
	for _, tt := range []struct {
		p, parts int32
		want     string
	}{
		{0, 2, "offsets=x seen=a seen=b table=t0"},
		{1, 2, "offsets=y seen=a seen=b table=t1"},
		{0, 4, "offsets=x seen=a seen=b table=t0"},
		{1, 4, "offsets=y seen=a seen=b table=t1"},
		{2, 4, "seen=a seen=b table=t0"},
		{3, 4, "seen=a seen=b table=t1"},
	} {
		if got := seeded(tt.p, tt.parts); got != tt.want {
			t.Errorf("task %d of %d seeded %q, want %q", tt.p, tt.parts, got, tt.want)
		}
	}
}

// A union list restores as the concatenation of every old task's whole
// list, as Flink's does, even when a task's file holds copies an earlier
// union restore gave it: task 0 folded the copies into its own list and
// added "new"; task 1 never wrote and still holds its copies. (Found by
// review: seeding writer by writer let task 1's stale copy of task 0's list
// overwrite the folded one.)
func TestSeedUnionListOfAnEarlierUnion(t *testing.T) {
	entry := func(writer int32, elems ...string) [2][]byte {
		var v []byte
		for _, e := range elems {
			v = append(append(v, byte(len(e))), e...)
		}
		return [2][]byte{kstate.UnionEntryKey("seen", writer), v}
	}
	dir := writeTestSavepoint(t, []entries{
		{entry(0, "a", "b", "new")},
		{entry(0, "a"), entry(1, "b")},
	})
	sp, err := savepoint.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &seedSource{sp: sp, drop: map[string]bool{}, inputs: map[string]bool{"in": true}}
	for _, p := range []int32{0, 1} {
		seeded := map[string]string{}
		if err := s.scan(context.Background(), p, 2, func(k, v []byte) error {
			seeded[string(k)] = string(v)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{string(entry(0)[0]): string(entry(0, "a", "b", "new")[1]), string(entry(1)[0]): string(entry(1, "a", "b")[1])}
		if fmt.Sprint(seeded) != fmt.Sprint(want) {
			t.Errorf("task %d seeded %q, want %q", p, seeded, want)
		}
	}
}

// A broadcast job's savepoint holds the engine's position entries beside
// the tables: a job that declares its States restores it, position and
// table together, and never one without the other. (Found by review: the
// position was taken for undeclared state, and dropping it re-applied the
// broadcast topic onto the restored table.)
func TestSeedBroadcastPositionGoesWithItsTable(t *testing.T) {
	table := [2][]byte{kstate.EncodeKey(kstate.KindOperator, "table", nil, []byte{kstate.OperatorBroadcast, 'k'}), {1, 'v'}}
	other := [2][]byte{kstate.UnionEntryKey("gone", 0), {1, 'x'}}
	pos := [2][]byte{kstate.PositionKey(0), kstate.EncodePosition(7)}
	open := func(states []string, allow bool, tasks ...entries) (*seedSource, error) {
		in := &Instance{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		in.cfg.RestoreFrom = writeTestSavepoint(t, tasks)
		in.cfg.InputTopics = []string{"in"}
		in.cfg.AllowNonRestoredState = allow
		noop := func(Context, *Record) error { return nil }
		in.cfg.Job = Job{Name: "j", States: states, Process: noop, OnBroadcast: noop}
		return in.openSeed(context.Background())
	}
	src, err := open([]string{"table"}, false, entries{table, pos})
	if err != nil || len(src.drop) != 0 {
		t.Fatalf("a job declaring its broadcast state restores its own savepoint: drop %v, %v", src.drop, err)
	}
	if _, err := open([]string{"table"}, true, entries{table, pos, other}); err == nil || !strings.Contains(err.Error(), "restores with all its operator state or not at all") {
		t.Fatalf("dropping operator state of a broadcast job's savepoint: %v, want a refusal", err)
	}
}
