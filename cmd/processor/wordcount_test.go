package main

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/savepoint"
)

// lines produces n unkeyed lines of words to topic "lines", spread over its
// partitions, and counts each word's occurrences into words.
func produceLines(t *testing.T, cl *kgo.Client, rng *rand.Rand, n int, words map[string]int) {
	t.Helper()
	recs := make([]*kgo.Record, 0, n)
	for range n {
		var line []string
		for range 1 + rng.IntN(6) {
			w := "w" + strconv.Itoa(rng.IntN(40))
			line = append(line, w)
			words[w]++
		}
		// Unkeyed, and placed round robin: the words of one partition
		// are counted by tasks of every partition after the hop.
		recs = append(recs, &kgo.Record{Topic: "lines", Partition: int32(len(recs) % 3), Value: []byte(strings.Join(line, " \t "))})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func total(words map[string]int) int {
	n := 0
	for _, c := range words {
		n += c
	}
	return n
}

// awaitCounts waits until the counts topic holds n committed records.
func awaitCounts(t *testing.T, brokers string, n int) {
	t.Helper()
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, "counts", 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= n })
	if err != nil || len(recs) < n {
		t.Fatalf("counts: %d of %d (%v)", len(recs), n, err)
	}
}

// checkWordCounts reads the committed counts until there is one per
// occurrence and checks that each word's outputs are exactly 1..n, each
// once, in order.
func checkWordCounts(t *testing.T, brokers string, words map[string]int) {
	t.Helper()
	checkWordCountsFrom(t, brokers, "counts", map[string]int{}, words)
}

func wordcountCluster(t *testing.T) (string, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "lines"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()[0]), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c.ListenAddrs()[0], cl
}

// wordcount over unkeyed lines in 3 partitions, two instance processes,
// one killed with -9 twice and restarted while lines arrive: every word's
// committed outputs are exactly its counts 1..n, each once, and the
// repartition topic is purged behind the committed offsets.
func TestWordcountKill9(t *testing.T) {
	brokers, cl := wordcountCluster(t)
	procs := []*proc{newProc(t, brokers, "i1"), newProc(t, brokers, "i2")}
	for _, p := range procs {
		p.env = append(p.env, "SLUICE_APP_ID=wc", "SLUICE_JOB=wordcount", "SLUICE_INPUT_TOPICS=lines", "SLUICE_OUTPUT_TOPIC=counts")
		p.start()
	}
	procs[0].awaitReady()
	words := map[string]int{}
	rng := rand.New(rand.NewPCG(5, 5))
	for round := range 6 {
		produceLines(t, cl, rng, 150, words)
		if round == 1 || round == 3 {
			// Killed once some of the lines are counted, while the
			// rest are in flight.
			awaitCounts(t, brokers, total(words)/2)
			victim := procs[round/2%2]
			victim.stop(syscall.SIGKILL)
			produceLines(t, cl, rng, 100, words)
			victim.start()
		}
	}
	checkWordCounts(t, brokers, words)

	// Purged: the repartition topic's log start moves up to the count
	// stage's committed offsets (every few seconds, in the background).
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(60 * time.Second)
	for {
		starts, err := adm.ListStartOffsets(context.Background(), sluice.RepartitionTopic("wc", "count"))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := adm.FetchOffsets(context.Background(), "wc-count")
		if err != nil {
			t.Fatal(err)
		}
		purged := true
		starts.Each(func(o kadm.ListedOffset) {
			c, _ := committed.Lookup(o.Topic, o.Partition)
			if o.Offset == 0 || o.Offset > c.At {
				purged = false
			}
		})
		if purged {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("repartition topic not purged: log starts %v, committed %v", starts, committed)
		}
		<-time.After(200 * time.Millisecond)
	}
	for _, p := range procs {
		if err := p.stop(syscall.SIGTERM); err != nil {
			t.Fatalf("SIGTERM: %v\n%s", err, p.log.String())
		}
	}
}

// A pipeline's savepoint (wordcount: split, then count, whose state is in
// its own changelog). Refused without --stop; with --stop --drain it is
// where the whole app stopped, the count stage's part in a directory of
// its own. A new app restored from it goes on counting each word from
// where the old one stopped (n+1.., no gap, no repeat), and a single job
// refuses it.
func TestStopWithSavepointOfAPipeline(t *testing.T) {
	brokers, cl := wordcountCluster(t)
	wordcountEnv := func(app, out, id string) map[string]string {
		env := aggregateEnv(t, brokers, app)
		env["SLUICE_JOB"], env["SLUICE_INPUT_TOPICS"], env["SLUICE_OUTPUT_TOPIC"], env["SLUICE_INSTANCE_ID"] = "wordcount", "lines", out, id
		return env
	}
	i1, i2 := startServe(t, wordcountEnv("wcsp", "counts", "i1")), startServe(t, wordcountEnv("wcsp", "counts", "i2"))
	rng := rand.New(rand.NewPCG(1, 1))
	words := map[string]int{}
	produceLines(t, cl, rng, 200, words)
	awaitCounts(t, brokers, total(words))

	spEnv := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "wcsp", "SLUICE_SAVEPOINT_DIR": t.TempDir()}
	var stdout, stderr bytes.Buffer
	// processor inspect of a pipeline's app (it failed, saying that
	// savepoints of pipelines were not supported, before they were).
	if code := inspectApp(context.Background(), nil, spEnv, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "wcsp-changelog") {
		t.Fatalf("inspect: exit %d, stdout %s, stderr %s", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := takeSavepoint(context.Background(), spEnv, nil, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "is a pipeline (later stages: count): its savepoint needs --stop") {
		t.Fatalf("without --stop: exit %d, stderr %s", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := takeSavepoint(context.Background(), spEnv, []string{"--stop", "--drain", "--timeout", "1m"}, &stdout, &stderr); code != 0 {
		t.Fatalf("savepoint --stop --drain exited %d:\n%s", code, stderr.String())
	}
	for _, s := range []*served{i1, i2} {
		if err := s.wait(t); err != nil {
			t.Fatalf("instance stopped with %v", err)
		}
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	loc := lines[len(lines)-1]
	sp, err := savepoint.Open(context.Background(), loc)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if m := sp.Manifest; m.Format != savepoint.FormatPipeline || len(m.Stages) != 1 || m.Stages[0].Name != "count" || m.Job != "wordcount-split" {
		t.Fatalf("manifest: format %d, stages %+v, job %q", m.Format, m.Stages, m.Job)
	}
	stageLoc, err := savepoint.Join(loc, sp.Manifest.Stages[0].Dir)
	if err != nil {
		t.Fatal(err)
	}
	count, err := savepoint.Open(context.Background(), stageLoc)
	if err != nil {
		t.Fatal(err)
	}
	defer count.Close()
	if m := count.Manifest; m.AppID != "wcsp-count" || m.Job != "wordcount" || len(m.Inputs) != 1 || m.Inputs[0].Topic != "wcsp-count-repartition" {
		t.Fatalf("the count stage's manifest: %+v", m)
	}

	// A single job refuses the pipeline's savepoint.
	agg := aggregateEnv(t, brokers, "wcsp-agg")
	agg["SLUICE_INPUT_TOPICS"], agg["SLUICE_RESTORE_FROM"] = "lines", loc
	if err := startServe(t, agg).wait(t); err == nil || !strings.Contains(err.Error(), "it is the savepoint of a pipeline (its later stages: count)") {
		t.Fatalf("a single job from a pipeline's savepoint: %v", err)
	}

	// A stage's part copied in from another savepoint is refused.
	forged := filepath.Join(t.TempDir(), "forged")
	if err := os.CopyFS(forged, os.DirFS(loc)); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(forged, "stage-count", savepoint.ManifestName)
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, []byte(strings.Replace(string(b), `"created": "20`, `"created": "19`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	forgedEnv := wordcountEnv("wcsp3", "counts3", "i4")
	forgedEnv["SLUICE_RESTORE_FROM"] = forged
	if err := startServe(t, forgedEnv).wait(t); err == nil || !strings.Contains(err.Error(), "not one savepoint's") {
		t.Fatalf("a stage's part from another savepoint: %v", err)
	}

	restored := wordcountEnv("wcsp2", "counts2", "i3")
	restored["SLUICE_RESTORE_FROM"] = loc
	i3 := startServe(t, restored)
	more := map[string]int{}
	produceLines(t, cl, rng, 100, more)
	checkWordCountsFrom(t, brokers, "counts2", words, more)
	i3.stop(t)
}

// checkWordCountsFrom reads topic's committed counts until there is one
// per occurrence in more, and checks that each word's outputs go on from
// its count in from: from[w]+1 .. from[w]+more[w], each once, in order.
func checkWordCountsFrom(t *testing.T, brokers, topic string, from, more map[string]int) {
	t.Helper()
	want := total(more)
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, topic, 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= want })
	if err != nil {
		t.Fatal(err)
	}
	next := maps.Clone(from)
	for _, r := range recs {
		w := string(r.Key)
		n, err := strconv.Atoi(string(r.Value))
		if err != nil || n != next[w]+1 {
			t.Fatalf("word %s: output %q after %d (a duplicate, a gap, a count that did not go on, or a bad value)", w, r.Value, next[w])
		}
		next[w] = n
	}
	for w, n := range more {
		if next[w] != from[w]+n {
			t.Errorf("word %s: counted to %d, want %d", w, next[w], from[w]+n)
		}
	}
	if len(recs) != want {
		t.Fatalf("%d outputs, want %d", len(recs), want)
	}
}

// A reset of a pipeline deletes every stage's group, changelog and state
// dir, not only the first's: the app then counts its input again from
// scratch, 1..n per word. (Found by review: the count stage kept its state
// and dropped every word after the reset.)
func TestResetOfAPipeline(t *testing.T) {
	brokers, cl := wordcountCluster(t)
	env := aggregateEnv(t, brokers, "wcr")
	env["SLUICE_JOB"], env["SLUICE_INPUT_TOPICS"], env["SLUICE_OUTPUT_TOPIC"] = "wordcount", "lines", "counts"
	s := startServe(t, env)
	words := map[string]int{}
	produceLines(t, cl, rand.New(rand.NewPCG(1, 1)), 50, words)
	awaitCounts(t, brokers, total(words))
	s.stop(t)

	resetEnv := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "wcr", "SLUICE_STATE_DIR": env["SLUICE_STATE_DIR"]}
	if code, stdout, stderr := runResetWith(t, resetEnv, "--yes"); code != 0 || !strings.Contains(stdout, "consumer group wcr-count") {
		t.Fatalf("reset exited %d:\n%s\n%s", code, stdout, stderr)
	}
	for _, name := range topicNames(t, brokers) {
		if strings.HasPrefix(name, "wcr-") && name != "wcr-dlq" {
			t.Errorf("topic %s survived the reset", name)
		}
	}
	if _, err := os.Stat(filepath.Join(env["SLUICE_STATE_DIR"], "wcr-count")); err == nil {
		t.Errorf("state dir wcr-count survived the reset")
	}

	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), "counts")
	if err != nil {
		t.Fatal(err)
	}
	env["SLUICE_METRICS_ADDR"] = freeAddr(t)
	s = startServe(t, env)
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, "counts", 30*time.Second, check.Settled(2*total(words)))
	if err != nil {
		t.Fatal(err)
	}
	s.stop(t)
	var after []*kgo.Record // the outputs of the run after the reset
	for _, r := range recs {
		if end, _ := ends.Lookup("counts", r.Partition); r.Offset >= end.Offset {
			after = append(after, r)
		}
	}
	if rep := check.WordCount(words, after); !rep.OK() {
		t.Fatalf("after the reset: %v", rep)
	}
}

// A pipeline stopped with records still in flight between its stages (its
// count stage's group behind the end of its repartition topic): --stop
// without --drain writes no savepoint, since a new app's count stage
// starts at its own repartition topic's start and those records would be
// in neither stage's part; it says so and how to take one.
func TestPipelineSavepointRefusesRecordsInFlight(t *testing.T) {
	brokers, cl := wordcountCluster(t)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	for _, topic := range []string{"wcx-changelog", "wcx-count-changelog", "wcx-count-repartition"} {
		if _, err := adm.CreateTopic(ctx, 3, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
	}
	// The app stopped: the split stage committed all its input, the count
	// stage two of the five records forwarded to its partition 1.
	var recs []*kgo.Record
	for i := range 5 {
		recs = append(recs, &kgo.Record{Topic: "wcx-count-repartition", Partition: 1, Key: []byte("w"), Value: []byte(strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(ctx, append(recs, &kgo.Record{Topic: "lines", Partition: 0, Value: []byte("w")})...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	commit := func(group, topic string, p int32, at int64) {
		var o kadm.Offsets
		o.Add(kadm.Offset{Topic: topic, Partition: p, At: at, LeaderEpoch: -1})
		if resp, err := adm.CommitOffsets(ctx, group, o); err != nil || resp.Error() != nil {
			t.Fatalf("commit %s: %v %v", group, err, resp.Error())
		}
	}
	commit("wcx", "lines", 0, 1)
	commit("wcx-count", "wcx-count-repartition", 1, 2)
	recordStages(t, cl, adm, "wcx", "count") // as the pipeline does at its start

	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := takeSavepoint(ctx, map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "wcx", "SLUICE_SAVEPOINT_DIR": dir},
		[]string{"--stop", "--timeout", "1m"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "3 records were in flight to stage group wcx-count when the app stopped") || !strings.Contains(stderr.String(), "no savepoint was written") ||
		!strings.Contains(stderr.String(), "--stop --drain") {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Fatalf("%d entries left in the savepoint directory", len(left))
	}
}

// recordStages writes app's record of its pipeline stages to its control
// topic, as sluice.Pipeline does when it starts.
func recordStages(t *testing.T, cl *kgo.Client, adm *kadm.Client, app string, stages ...string) {
	t.Helper()
	if err := control.Create(context.Background(), adm, app); err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: control.TopicName(app), Key: control.PipelineKey, Value: control.EncodePipeline(control.Pipeline{Stages: stages})}
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// The stages of a pipeline are those it recorded in its control topic, not
// whatever topics are named like its stages': an app rp beside an app
// rp-v2 whose stage count has the topic rp-v2-count-repartition is not
// taken for a pipeline of the stage v2-count (found by review: its stop
// waited for rp-v2's group); without a record it is refused, rather than
// saved as its first stage alone, unless --one-job says it is one job.
func TestPipelineStagesComeFromItsRecord(t *testing.T) {
	_, cl := wordcountCluster(t)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	for _, topic := range []string{"rp-v2-count-repartition", "rp-count-repartition"} {
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pipelineStages(ctx, cl, adm, "rp", false); !errors.Is(err, errAmbiguous) || !strings.Contains(err.Error(), "--one-job") {
		t.Fatalf("topics named like stages, no record: %v; want a refusal naming --one-job", err)
	}
	if stages, err := pipelineStages(ctx, cl, adm, "rp", true); err != nil || stages != nil {
		t.Fatalf("with --one-job: stages %q, %v; want none (one job)", stages, err)
	}
	if stages, err := pipelineStages(ctx, cl, adm, "other", false); err != nil || stages != nil {
		t.Fatalf("no such topics: stages %q, %v; want none", stages, err)
	}
	recordStages(t, cl, adm, "rp", "count")
	if stages, err := pipelineStages(ctx, cl, adm, "rp", false); err != nil || !slices.Equal(stages, []string{"count"}) {
		t.Fatalf("with the record: stages %q, %v; want [count]", stages, err)
	}
	recordStages(t, cl, adm, "rp", "count", "gone")
	if _, err := pipelineStages(ctx, cl, adm, "rp", false); err == nil || !strings.Contains(err.Error(), "repartition topic rp-gone-repartition is missing") {
		t.Fatalf("a recorded stage without its topic: %v", err)
	}
}

// A stage that never committed an offset on a partition of its repartition
// topic is behind by what the partition's log holds, and by nothing when
// that is only an aborted transaction. (Found by review: such a partition
// was counted from offset 0, aborted records included, so the stop reported
// records in flight and --drain never ended.)
func TestBehindOfAPartitionNeverCommitted(t *testing.T) {
	brokers, cl := wordcountCluster(t)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	const topic = "ab-count-repartition"
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	txn, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.TransactionalID("ab-test"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	produce := func(commit kgo.TransactionEndTry) {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte{byte(i)}}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	produce(kgo.TryAbort)
	if behind, _, err := behindOf(ctx, cl, adm, "ab-count", []string{topic}); err != nil || behind != 0 {
		t.Fatalf("an aborted transaction alone: behind %d, %v; want 0", behind, err)
	}
	produce(kgo.TryCommit)
	if behind, _, err := behindOf(ctx, cl, adm, "ab-count", []string{topic}); err != nil || behind == 0 {
		t.Fatalf("committed records never read: behind %d, %v; want more than 0", behind, err)
	}
}
