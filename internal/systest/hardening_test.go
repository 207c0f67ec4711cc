package systest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	bolt "go.etcd.io/bbolt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/kstate"
)

// Regression tests for the hardening issue's defects. Each failed on the
// code before its fix.

// sender produces records synchronously to the input topic.
type sender struct {
	t  *testing.T
	cl *kgo.Client
}

func newSender(t *testing.T, brokers string) *sender {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &sender{t: t, cl: cl}
}

func (s *sender) send(key string, values ...string) {
	s.t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: input, Key: []byte(key), Value: []byte(v)}
	}
	if err := s.cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		s.t.Fatal(err)
	}
}

// failNextProduceTo makes the broker answer the next produce request that
// carries topic with err for every partition in it.
func failNextProduceTo(c *kfake.Cluster, topicID [16]byte, topic string, err *kerr.Error) {
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		hit := false
		for _, t := range req.Topics {
			if t.Topic == topic || t.TopicID == topicID {
				hit = true
			}
		}
		if !hit {
			return nil, nil, false // not handled: the control stays for the next request
		}
		return check.ProduceError(req, err), nil, true
	})
}

func topicID(t *testing.T, brokers, topic string) [16]byte {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).Metadata(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return md.Topics[topic].ID
}

// newFaultCluster is newCluster for tests that also need the cluster
// itself: fault controls, compaction. seed lists the topics to create with
// one partition.
func newFaultCluster(t *testing.T, seed ...string) (*kfake.Cluster, string) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, seed...), kip848Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()[0]
}

// createTopic creates a one-partition topic with configs.
func createTopic(t *testing.T, brokers, topic string, configs map[string]*string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, configs, topic); err != nil {
		t.Fatal(err)
	}
}

// outputsOf returns the output values per key, in order.
func outputsOf(recs []*kgo.Record) map[string][]string {
	out := map[string][]string{}
	for _, r := range recs {
		out[string(r.Key)] = append(out[string(r.Key)], string(r.Value))
	}
	return out
}

// Defect 1: at-least-once produced the epoch's markers together with its
// outputs. An output that failed while the marker was acknowledged left a
// durable marker past its input; after the session was rebuilt, the restore
// resumed past that input and its output was never written. Now the markers
// go out only after every output was acknowledged.
func TestAtLeastOnceFailedOutputIsNotLost(t *testing.T) {
	c, brokers := newFaultCluster(t, input, output)
	outID := topicID(t, brokers, output)
	s := newSender(t, brokers)
	o := options(brokers, "alos", "i1", t.TempDir(), "aggregate", sluice.AtLeastOnce)
	o.Job = counterJob()
	o.Checkpoint.TolerableFailures = 0 // one failed checkpoint rebuilds the session
	startInProcess(t, o)

	s.send("a", "+")
	waitOutputs(t, brokers, 1)
	failNextProduceTo(c, outID, output, kerr.UnknownServerError)
	s.send("a", "+")
	s.send("a", "+")
	// At-least-once: duplicates are allowed, a missing count is not. The
	// failed attempt's later outputs can land before the replayed ones,
	// so read until all are there or nothing arrives for 30s.
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, output, 30*time.Second, func(r []*kgo.Record) bool {
		got := outputsOf(r)["a"]
		return slicesContain(got, "1") && slicesContain(got, "2") && slicesContain(got, "3")
	})
	if err != nil {
		t.Fatal(err)
	}
	got := outputsOf(recs)["a"]
	for _, want := range []string{"1", "2", "3"} {
		if !slicesContain(got, want) {
			t.Fatalf("outputs of a: %v, count %s missing", got, want)
		}
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// bigJob copies each input to the output, except that the value "big"
// becomes a value larger than the output topic accepts.
func bigJob() sluice.Job {
	return sluice.Job{Name: "big", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
		v := rec.Value
		if string(v) == "big" {
			// Incompressible, so the producer's compression cannot
			// bring it under the limit.
			rng := rand.New(rand.NewPCG(1, 2))
			v = make([]byte, 4000)
			for i := range v {
				v[i] = byte(rng.Uint32())
			}
		}
		ctx.Emit(rec.Key, v)
		return nil
	}}
}

// Defect 2: one output that can never be produced (MESSAGE_TOO_LARGE)
// aborted its epoch on every replay, so nothing after it ever committed.
// Now its input goes to the dead-letter topic (stage emit) and everything
// else goes on; records batched with it are not blamed.
func TestPermanentOutputFailureGoesToDeadLetters(t *testing.T) {
	for _, tt := range []struct {
		g         sluice.Guarantee
		tolerable int
	}{{sluice.ExactlyOnce, 3}, {sluice.AtLeastOnce, 3}, {sluice.ExactlyOnce, 0}} {
		g := tt.g
		t.Run(fmt.Sprintf("%s/tolerable=%d", g, tt.tolerable), func(t *testing.T) {
			_, brokers := newFaultCluster(t, input)
			createTopic(t, brokers, output, map[string]*string{"max.message.bytes": kadm.StringPtr("2000")})
			s := newSender(t, brokers)
			o := options(brokers, "big", "i1", t.TempDir(), "echo", g)
			o.Job = bigJob()
			// A refused commit is not a failure: even with none
			// tolerated the instance dead-letters and goes on.
			o.Checkpoint.TolerableFailures = tt.tolerable
			startInProcess(t, o)

			// One produce request: the outputs are batched together.
			s.send("k", "1", "2", "big", "3", "4")
			s.send("k", "5")
			recs := waitAtLeast(t, brokers, output, 5)
			var vals []string
			for _, r := range recs {
				vals = append(vals, string(r.Value))
			}
			if g == sluice.ExactlyOnce && strings.Join(vals, ",") != "1,2,3,4,5" {
				t.Fatalf("outputs %v, want 1,2,3,4,5", vals)
			}
			for _, want := range []string{"1", "2", "3", "4", "5"} {
				if !slicesContain(vals, want) {
					t.Fatalf("outputs %v: %s missing", vals, want)
				}
			}
			dlq := waitAtLeast(t, brokers, "big-dlq", 1)
			hdr := map[string]string{}
			for _, h := range dlq[0].Headers {
				hdr[h.Key] = string(h.Value)
			}
			if string(dlq[0].Value) != "big" || hdr[sluice.HeaderStage] != "emit" || !strings.Contains(hdr[sluice.HeaderError], "MESSAGE_TOO_LARGE") {
				t.Fatalf("dead letter %q with headers %v", dlq[0].Value, hdr)
			}
			if g == sluice.ExactlyOnce && len(dlq) != 1 {
				t.Fatalf("%d dead letters, want 1", len(dlq))
			}
		})
	}
}

func waitAtLeast(t *testing.T, brokers, topic string, n int) []*kgo.Record {
	t.Helper()
	more, err := check.ReadCommitted(context.Background(), []string{brokers}, topic, 30*time.Second, check.Settled(n))
	if err != nil {
		t.Fatal(err)
	}
	if len(more) < n {
		t.Fatalf("%s: %d records after 30s of silence, want %d", topic, len(more), n)
	}
	return more
}

// Defect 3: a local file that was away longer than the changelog keeps its
// tombstones restored from its stored offset and never saw the deletes that
// compaction had dropped since, so deleted keys came back. Now such a file
// is restored from the start of the changelog. Files of released tasks are
// deleted after StateCleanupDelay.
func TestStaleStateFileDoesNotResurrectDeletedKeys(t *testing.T) {
	c, brokers := newFaultCluster(t, input, output)
	// Tombstones are dropped by the first compaction after they are
	// written.
	createTopic(t, brokers, "stale-changelog", map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"), "delete.retention.ms": kadm.StringPtr("0"),
	})
	s := newSender(t, brokers)
	cfg := func(id, dir string) sluice.Options {
		o := options(brokers, "stale", id, dir, "aggregate", sluice.ExactlyOnce)
		o.Job = counterJob()
		return o
	}
	dirA := t.TempDir()
	a := startInProcess(t, cfg("a", dirA))
	s.send("x", "+", "+", "+")
	waitOutputs(t, brokers, 3)
	a.stop(t)

	// The partition moves to b, which deletes x; compaction then drops
	// the tombstone.
	b := startInProcess(t, cfg("b", t.TempDir()))
	s.send("x", "reset")
	s.send("y", "+")
	waitOutputs(t, brokers, 4)
	// A later epoch, so the tombstone's batch is not the last one, which
	// compaction never touches.
	s.send("y", "+")
	waitOutputs(t, brokers, 5)
	b.stop(t)
	c.Compact()

	// a comes back with its old file, which still holds x = 3.
	startInProcess(t, cfg("a", dirA))
	s.send("x", "+")
	recs := waitOutputs(t, brokers, 6)
	if got := string(recs[len(recs)-1].Value); got != "1" || string(recs[len(recs)-1].Key) != "x" {
		t.Fatalf("x after its deletion counted %s, want 1 (a stale file brought it back)", got)
	}
}

// Released tasks' files are deleted once they have been left alone for
// StateCleanupDelay; owned tasks' files are kept.
func TestReleasedTaskFilesAreDeleted(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 20, 41)
	dirA := t.TempDir()
	oa := options(brokers, "clean", "a", dirA, "aggregate", sluice.ExactlyOnce)
	oa.StateCleanupDelay = time.Millisecond
	a := startInProcess(t, oa)
	a.awaitReady(t)
	f.produce(200, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatal(rep)
	}
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(dirA, "clean", "task-*.db"))
		return m
	}
	if n := len(files()); n != 2 {
		t.Fatalf("a holds %d state files, want 2", n)
	}
	b := startInProcess(t, options(brokers, "clean", "b", t.TempDir(), "aggregate", sluice.ExactlyOnce))
	b.awaitReady(t)
	deadline := time.Now().Add(30 * time.Second)
	for len(files()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("a still holds %v after giving a task to b", files())
		}
		f.produce(10, 0) // keeps a's loop turning
		<-time.After(50 * time.Millisecond)
	}
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatal(rep)
	}
}

// Defect 4: after kill -9, a restarted instance waited for its own dangling
// transaction to time out before its restores could finish (they wait for
// the changelog's last stable offset). Now it fences the transactional id
// first, which aborts that transaction at once. The transaction timeout
// here is 60s: the outputs must all be read within 50s of the restart.
func TestRestartDoesNotWaitOutItsDanglingTransaction(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 20, 42)
	c := newChild(t, brokers, "dangle", "i1", t.TempDir(), "aggregate", sluice.ExactlyOnce, "SYSTEST_TXN_TIMEOUT=60s")
	c.start("SYSTEST_CRASH_AT="+sluice.PointBeforeCommit, "SYSTEST_CRASH_AFTER=2")
	deadline := time.Now().Add(60 * time.Second)
	for c.running() {
		if time.Now().After(deadline) {
			c.dumpLog()
			t.Fatal("instance did not reach the crash point")
		}
		f.produce(20, 0)
		c.wait(100 * time.Millisecond)
	}
	// Killed with changelog records in its open transaction.
	start := time.Now()
	c.start()
	f.produce(20, 0)
	rep := awaitAggregate(t, brokers, f, awaitIdle)
	if !rep.OK() {
		c.dumpLog()
		t.Fatalf("after restart: %v", rep)
	}
	took := time.Since(start)
	if took > 50*time.Second {
		t.Fatalf("restart over a dangling transaction (timeout 60s): all outputs after %v, as if it waited for the broker to abort it", took)
	}
	t.Logf("restart over a dangling transaction (timeout 60s): all outputs after %v", took.Round(time.Millisecond))
}

// Two live processes with the same instance id fenced each other forever.
// Now one of them stops with an error that says why.
func TestDuplicateInstanceIDStops(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 20, 43)
	run := func() chan error {
		inst, err := sluice.New(options(brokers, "dup", "same", t.TempDir(), "aggregate", sluice.ExactlyOnce))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done, exited := make(chan error, 1), make(chan struct{})
		go func() {
			defer close(exited)
			done <- inst.Run(ctx)
		}()
		// Stop the survivor before its state dir is removed.
		t.Cleanup(func() { cancel(); <-exited })
		return done
	}
	a, b := run(), run()
	deadline := time.After(60 * time.Second)
	for {
		f.produce(20, 0)
		select {
		case err := <-a:
			if !errors.Is(err, sluice.ErrDuplicateInstance) {
				t.Fatalf("first instance ended with %v, want ErrDuplicateInstance", err)
			}
			t.Logf("stopped: %v", err)
			return
		case err := <-b:
			if !errors.Is(err, sluice.ErrDuplicateInstance) {
				t.Fatalf("second instance ended with %v, want ErrDuplicateInstance", err)
			}
			t.Logf("stopped: %v", err)
			return
		case <-deadline:
			t.Fatal("two instances with one id still running after 60s")
		case <-time.After(100 * time.Millisecond): // paces the feed
		}
	}
}

// A damaged state file is moved aside and its task restored from the
// changelog; nothing is lost or repeated.
func TestCorruptStateFileIsRestoredFromChangelog(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 30, 44)
	dir := t.TempDir()
	p := startInProcess(t, options(brokers, "corrupt", "i1", dir, "aggregate", sluice.ExactlyOnce))
	f.produce(500, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatal(rep)
	}
	p.stop(t)
	path := filepath.Join(dir, "corrupt", "task-0000.db")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()-100); err != nil {
		t.Fatal(err)
	}
	startInProcess(t, options(brokers, "corrupt", "i1", dir, "aggregate", sluice.ExactlyOnce))
	f.produce(500, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatal(rep)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 1 {
		t.Fatalf("damaged file not moved aside: %v", aside)
	}
}

// A file left by a kill -9 with a page damaged as well (a bad disk) is
// moved aside and the task restored from its changelog, at the second
// start on the same boot (the first trusts the file and stops at the
// damaged page). Before, bbolt's open panicked in a goroutine of its own
// while rebuilding the freelist, which took the process down at every
// start.
func TestKilledInstancesDamagedFileIsRestored(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 30, 46)
	dir := t.TempDir()
	c := newChild(t, brokers, "killedjunk", "i1", dir, "aggregate", sluice.ExactlyOnce)
	c.start()
	f.produce(500, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		c.dumpLog()
		t.Fatal(rep)
	}
	c.signal(syscall.SIGKILL)
	c.wait(10 * time.Second)
	path := filepath.Join(dir, "killedjunk", "task-0000.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var root int64
	err = db.View(func(tx *bolt.Tx) error {
		root = int64(tx.Bucket([]byte("state")).Root())
		return nil
	})
	db.Close()
	if err != nil || root == 0 {
		t.Fatalf("state bucket root %d: %v", root, err)
	}
	junk := bytes.Repeat([]byte{0xA5}, os.Getpagesize())
	fh, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.WriteAt(junk, root*int64(len(junk))); err != nil {
		t.Fatal(err)
	}
	fh.Close()
	// On the same boot a crash cannot damage a page, so the first start
	// trusts the file without reading its pages (kstate's bootKey), and
	// the damaged page stops it at the first read. The second start
	// follows a second crash in a row: it reads every page, refuses the
	// file and restores the task.
	c.start()
	f.produce(500, 0)
	if !c.wait(60 * time.Second) {
		c.dumpLog()
		t.Fatal("the instance went on reading a damaged page")
	}
	c.start()
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		c.dumpLog()
		t.Fatal(rep)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 1 {
		c.dumpLog()
		t.Fatalf("damaged file not moved aside: %v", aside)
	}
}

// faultyBackend fails every Apply with ENOSPC while full is set.
type faultyBackend struct {
	kstate.Backend
	full *atomic.Bool
}

func (b faultyBackend) Apply(muts []kstate.Mutation, meta kstate.Meta) error {
	if b.full.Load() {
		return &os.PathError{Op: "write", Path: "task.db", Err: syscall.ENOSPC}
	}
	return b.Backend.Apply(muts, meta)
}

// A full disk during apply stops the instance with an error naming it
// (the binary exits 1); nothing was applied half, and a restart once there
// is room again carries on exactly once.
func TestDiskFullStopsCleanlyAndRecovers(t *testing.T) {
	brokers := newCluster(t, 2)
	f := newFeeder(t, brokers, 30, 45)
	dir := t.TempDir()
	var full atomic.Bool
	o := options(brokers, "full", "i1", dir, "aggregate", sluice.ExactlyOnce)
	o.OpenBackend = func(kind, dir, task string) (kstate.Backend, error) {
		be, err := kstate.Open(kind, dir, task)
		if err != nil {
			return nil, err
		}
		return faultyBackend{be, &full}, nil
	}
	inst, err := sluice.New(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- inst.Run(context.Background()) }()
	f.produce(300, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatal(rep)
	}
	full.Store(true)
	f.produce(300, 0)
	select {
	case err := <-done:
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("instance stopped with %v, want ENOSPC", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("instance still running 30s after its disk filled")
	}
	startInProcess(t, options(brokers, "full", "i1", dir, "aggregate", sluice.ExactlyOnce))
	f.produce(300, 0)
	if rep := awaitAggregate(t, brokers, f, awaitIdle); !rep.OK() {
		t.Fatal(rep)
	}
}
