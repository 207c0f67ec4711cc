package main

import (
	"bytes"
	"context"
	bin "encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/objtest"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/savepoint"
)

// inputLog is every record produced to "in", by partition, in offset
// order, as the broker acknowledged it.
type inputLog struct {
	mu   sync.Mutex
	recs map[int32][]*kgo.Record
	n    int
}

func (l *inputLog) produce(t *testing.T, cl *kgo.Client, rng *rand.Rand, count int) {
	var recs []*kgo.Record
	for range count {
		key := "k" + strconv.Itoa(rng.IntN(37))
		recs = append(recs, &kgo.Record{Topic: "in", Key: []byte(key), Value: []byte(strconv.Itoa(rng.IntN(2001) - 1000))})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Error(err)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.recs == nil {
		l.recs = map[int32][]*kgo.Record{}
	}
	for _, r := range recs {
		l.recs[r.Partition] = append(l.recs[r.Partition], r)
	}
	l.n += count
}

// below is the aggregate of every key of partition p over the records
// with an offset below end: the state a task holds once it has read them.
func (l *inputLog) below(p int32, end int64) map[string]jobs.Aggregation {
	l.mu.Lock()
	defer l.mu.Unlock()
	aggs := map[string]jobs.Aggregation{}
	for _, r := range l.recs[p] {
		if r.Offset >= end {
			continue
		}
		v, _ := strconv.ParseInt(string(r.Value), 10, 64)
		a, ok := aggs[string(r.Key)]
		if !ok {
			a = jobs.Aggregation{Min: v, Max: v}
		}
		a.Count++
		a.Sum += v
		a.Min, a.Max = min(a.Min, v), max(a.Max, v)
		aggs[string(r.Key)] = a
	}
	return aggs
}

func savepointCluster(t *testing.T) (string, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()[0]
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return brokers, cl
}

func aggregateEnv(t *testing.T, brokers, app string) map[string]string {
	return map[string]string{
		"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": app, "SLUICE_JOB": "aggregate", "SLUICE_INSTANCE_ID": "i1",
		"SLUICE_INPUT_TOPICS": "in", "SLUICE_OUTPUT_TOPIC": "out", "SLUICE_STATE_DIR": t.TempDir(),
		"SLUICE_METRICS_ADDR": freeAddr(t), "SLUICE_SESSION_TIMEOUT": "6s",
	}
}

// awaitOutputs waits until the output topic holds n committed records.
func awaitOutputs(t *testing.T, brokers string, n int) {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, "out", 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= n })
	if err != nil || len(recs) < n {
		t.Fatalf("outputs: %d of %d (%v)", len(recs), n, err)
	}
}

// runAggregate starts an aggregate instance of app, feeds it n records and
// waits until all its outputs are committed.
func runAggregate(t *testing.T, brokers, app string, cl *kgo.Client, in *inputLog, rng *rand.Rand, n int) *served {
	t.Helper()
	s := startServe(t, aggregateEnv(t, brokers, app))
	s.awaitReady(t)
	in.produce(t, cl, rng, n)
	awaitOutputs(t, brokers, in.n)
	return s
}

// save runs `processor savepoint` in-process, writing under a new
// directory, and opens what it printed.
func save(t *testing.T, brokers, app string) *savepoint.Savepoint {
	t.Helper()
	return saveTo(t, brokers, app, "file://"+t.TempDir())
}

// saveTo runs `processor savepoint` in-process with SLUICE_SAVEPOINT_DIR
// root, and opens and verifies the location it printed.
func saveTo(t *testing.T, brokers, app, root string) *savepoint.Savepoint {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": app, "SLUICE_SAVEPOINT_DIR": root}
	if code := takeSavepoint(context.Background(), env, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("savepoint exited %d; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	dir := lines[len(lines)-1]
	name, _, _ := strings.Cut(dir, "?")
	if !strings.HasPrefix(path.Base(name), app+"-") {
		t.Fatalf("savepoint at %q, want a directory named after %s", dir, app)
	}
	sp, err := savepoint.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	if n := strings.Count(stderr.String(), `"msg":"task saved"`); n != len(sp.Manifest.Tasks) {
		t.Errorf("stderr reports %d tasks saved, the manifest %d:\n%s", n, len(sp.Manifest.Tasks), stderr.String())
	}
	if err := sp.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sp
}

// checkTasks checks that every task's state in sp is the aggregate of its
// partition's input below the offset of its cut, and returns the keys'
// aggregates.
func checkTasks(t *testing.T, sp *savepoint.Savepoint, in *inputLog) map[string]jobs.Aggregation {
	t.Helper()
	m := sp.Manifest
	if m.Format != 1 || m.ChangelogTopic != changelog.TopicName(m.AppID) || fmt.Sprint(m.Inputs) != "[{in 4}]" || len(m.Tasks) != 4 {
		t.Fatalf("manifest: %+v", m)
	}
	if fmt.Sprint(m.States) != "[{aggregate keyed unknown}]" {
		t.Errorf("states: %+v", m.States)
	}
	all := map[string]jobs.Aggregation{}
	for p, task := range m.Tasks {
		if task.Partition != int32(p) {
			t.Fatalf("task %d is partition %d", p, task.Partition)
		}
		got := map[string]jobs.Aggregation{}
		err := sp.Scan(context.Background(), task, func(k, v []byte) error {
			key, err := kstate.DecodeKey(k)
			if err != nil {
				return err
			}
			if key.Kind != kstate.KindKeyed || key.Name != "aggregate" || len(v) != 32 {
				return fmt.Errorf("unexpected entry %+v = %x", key, v)
			}
			f := func(i int) int64 { return int64(bin.BigEndian.Uint64(v[8*i:])) }
			got[string(key.UserKey)] = jobs.Aggregation{Count: f(0), Sum: f(1), Min: f(2), Max: f(3)}
			return nil
		})
		if err != nil {
			t.Fatalf("task %d: %v", p, err)
		}
		want := in.below(int32(p), task.Offsets["in"])
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("task %d at offset %d:\n got  %v\n want %v", p, task.Offsets["in"], got, want)
		}
		if task.Keys != int64(len(want)) {
			t.Errorf("task %d: manifest says %d keys, want %d", p, task.Keys, len(want))
		}
		for k, a := range got {
			all[k] = a
		}
	}
	return all
}

// lastMarkers returns each changelog partition's last epoch marker, read as
// a restore reads it (read_committed, up to the last marker, waiting out open
// transactions): no idle timeout to guess.
func lastMarkers(t *testing.T, brokers, app string, partitions int32) map[int32]changelog.Marker {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	last := map[int32]changelog.Marker{}
	for p := range partitions {
		res, err := changelog.Restore(ctx, changelog.RestoreParams{
			Admin:      kadm.NewClient(cl),
			ClientOpts: []kgo.Opt{kgo.SeedBrokers(brokers)},
			Topic:      changelog.TopicName(app),
			Partition:  p,
			Apply:      func([]kstate.Mutation, kstate.Meta) error { return nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Last != nil {
			last[p] = *res.Last
		}
	}
	return last
}

// A savepoint of a stopped app holds every key's aggregate of all input,
// and each task's cut is the changelog's last marker.
func TestSavepointOfAggregate(t *testing.T) {
	brokers, cl := savepointCluster(t)
	inst := startServe(t, aggregateEnv(t, brokers, "sp"))
	inst.awaitReady(t)
	var in inputLog
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		in.produce(t, cl, rng, 300)
	}
	awaitOutputs(t, brokers, in.n)
	inst.stop(t) // the savepoint needs no instance

	sp := save(t, brokers, "sp")
	aggs := checkTasks(t, sp, &in)
	// Every key, with the aggregate of all its input: each task's cut is
	// past all of it.
	want := map[string]jobs.Aggregation{}
	for p := range int32(4) {
		for k, a := range in.below(p, 1<<62) {
			want[k] = a
		}
	}
	if fmt.Sprint(aggs) != fmt.Sprint(want) {
		t.Fatalf("aggregates:\n got  %v\n want %v", aggs, want)
	}
	markers := lastMarkers(t, brokers, "sp", 4)
	for _, task := range sp.Manifest.Tasks {
		m := markers[task.Partition]
		if task.Epoch != m.Epoch || fmt.Sprint(task.Offsets) != fmt.Sprint(m.Offsets) || task.Watermark != nil {
			t.Errorf("task %d: epoch %d offsets %v watermark %v; last marker: epoch %d offsets %v",
				task.Partition, task.Epoch, task.Offsets, task.Watermark, m.Epoch, m.Offsets)
		}
		if n := int64(len(in.recs[task.Partition])); task.Offsets["in"] != n {
			t.Errorf("task %d cut at input offset %d, want %d (all its input)", task.Partition, task.Offsets["in"], n)
		}
	}
}

// A savepoint taken while the app keeps processing new input is consistent
// task by task: each task's state is exactly its input below its cut.
func TestSavepointWhileRunning(t *testing.T) {
	brokers, cl := savepointCluster(t)
	var in inputLog
	rng := rand.New(rand.NewPCG(3, 4))
	inst := runAggregate(t, brokers, "live", cl, &in, rng, 500)

	sp := produceWhile(t, cl, &in, func() *savepoint.Savepoint { return save(t, brokers, "live") })
	checkTasks(t, sp, &in)
	total := cutTotal(sp)
	t.Logf("cuts cover %d of %d inputs", total, in.n)
	if total < 500 {
		t.Fatalf("the tasks' cuts cover %d inputs, fewer than the 500 committed before", total)
	}
	inst.stop(t)
}

func TestSavepointBadEnvironmentExitsTwo(t *testing.T) {
	good := map[string]string{"SLUICE_BROKERS": "127.0.0.1:1", "SLUICE_APP_ID": "app", "SLUICE_SAVEPOINT_DIR": t.TempDir()}
	tests := []struct {
		name, variable, value string
	}{
		{"other object storage", "SLUICE_SAVEPOINT_DIR", "abs://container/prefix"},
		{"azure without an account", "SLUICE_SAVEPOINT_DIR", "azblob://container/prefix"},
		{"unknown azblob parameter", "SLUICE_SAVEPOINT_DIR", "azblob://container/prefix?no_such=1"},
		{"unknown s3 parameter", "SLUICE_SAVEPOINT_DIR", "s3://bucket/prefix?no_such=1"},
		{"unknown gs parameter", "SLUICE_SAVEPOINT_DIR", "gs://bucket/prefix?no_such=1"},
		{"gs over gRPC", "SLUICE_SAVEPOINT_DIR", "gs://bucket/prefix?grpc=true"},
		{"s3 without bucket", "SLUICE_SAVEPOINT_DIR", "s3:///prefix"},
		{"missing dir", "SLUICE_SAVEPOINT_DIR", ""},
		{"empty file URL", "SLUICE_SAVEPOINT_DIR", "file://"},
		{"missing brokers", "SLUICE_BROKERS", ""},
		{"bad app id", "SLUICE_APP_ID", "no/slash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range good {
				env[k] = v
			}
			delete(env, tt.variable)
			if tt.value != "" {
				env[tt.variable] = tt.value
			}
			var stdout, stderr bytes.Buffer
			if code := takeSavepoint(context.Background(), env, nil, &stdout, &stderr); code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tt.variable) || stdout.Len() != 0 {
				t.Fatalf("stderr %q, stdout %q: want one line naming %s", stderr.String(), stdout.String(), tt.variable)
			}
			if tt.value == "abs://container/prefix" && !strings.Contains(lines[0], "abs:// is not supported") {
				t.Fatalf("stderr %q: want it to say abs:// is not supported", lines[0])
			}
			if tt.value == "azblob://container/prefix" && azureBuilt && !strings.Contains(lines[0], "AZURE_STORAGE_ACCOUNT") {
				t.Fatalf("stderr %q: want it to say the account is missing", lines[0])
			}
		})
	}
	// The binary's wiring: `processor savepoint` exits 2 the same way.
	cmd := exec.Command(binary, "savepoint")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "SLUICE_BROKERS=127.0.0.1:1", "SLUICE_APP_ID=app", "SLUICE_SAVEPOINT_DIR=abs://container/prefix"}
	out, err := cmd.CombinedOutput()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 || !strings.Contains(string(out), "SLUICE_SAVEPOINT_DIR") {
		t.Fatalf("processor savepoint: %v, output %q", err, out)
	}
}

// `processor savepoint` writes to an object store (S3, Google Cloud
// Storage, Azure Blob Storage) and prints the URL that SLUICE_RESTORE_FROM takes, query
// parameters kept.
func TestSavepointToObjectStores(t *testing.T) {
	for _, st := range []struct {
		name string
		root func(t *testing.T) string
	}{
		{"s3", func(t *testing.T) string { loc, _ := objtest.S3(t); return loc }},
		{"gcs", func(t *testing.T) string { loc, _ := objtest.GCS(t); return loc }},
		{"azure", func(t *testing.T) string { loc, _ := objtest.Azure(t); return loc }},
	} {
		t.Run(st.name, func(t *testing.T) {
			if st.name == "gcs" && !gcsBuilt {
				t.Skip("built with -tags nogcs")
			}
			if st.name == "azure" && !azureBuilt {
				t.Skip("built with -tags noazure")
			}
			app := "sp" + st.name
			brokers, cl := savepointCluster(t)
			inst := startServe(t, aggregateEnv(t, brokers, app))
			inst.awaitReady(t)
			var in inputLog
			in.produce(t, cl, rand.New(rand.NewPCG(7, 8)), 400)
			awaitOutputs(t, brokers, in.n)
			inst.stop(t)

			root := st.root(t)
			sp := saveTo(t, brokers, app, root)
			base, query, _ := strings.Cut(root, "?")
			if !strings.HasPrefix(sp.Location, base+"/"+app+"-") || query != "" && !strings.HasSuffix(sp.Location, "?"+query) {
				t.Fatalf("printed %q, want %s/%s-<time>?%s", sp.Location, base, app, query)
			}
			checkTasks(t, sp, &in)

			// A new app id restores from the URL printed, and continues.
			from, _ := spAggregates(t, sp)
			in.produce(t, cl, rand.New(rand.NewPCG(9, 9)), 100)
			dst := startServe(t, restoredEnv(t, brokers, app+"-new", "memory", sp))
			checkContinues(t, brokers, app+"-new-out", from, &in, in.n-cutTotal(sp))
			dst.stop(t)
		})
	}
}

// An app that never ran has no changelog: exit 1, saying so, and no
// savepoint directory left behind.
func TestSavepointWithoutChangelogFails(t *testing.T) {
	brokers, _ := savepointCluster(t)
	root := t.TempDir()
	var stdout, stderr bytes.Buffer
	env := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "never-ran", "SLUICE_SAVEPOINT_DIR": root}
	if code := takeSavepoint(context.Background(), env, nil, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "no changelog topic") {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 || stdout.Len() != 0 {
		t.Fatalf("left %v in the savepoint dir, printed %q", entries, stdout.String())
	}
}
