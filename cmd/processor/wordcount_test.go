package main

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
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
	want := total(words)
	recs, err := check.ReadCommitted(context.Background(), []string{brokers}, "counts", 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= want })
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	for _, r := range recs {
		w := string(r.Key)
		n, err := strconv.Atoi(string(r.Value))
		if err != nil || n != next[w]+1 {
			t.Fatalf("word %s: output %q after %d (a duplicate, a gap or a bad value)", w, r.Value, next[w])
		}
		next[w] = n
	}
	for w, n := range words {
		if next[w] != n {
			t.Errorf("word %s: counted to %d, want %d", w, next[w], n)
		}
	}
	if len(recs) != want {
		t.Fatalf("%d outputs, want %d", len(recs), want)
	}
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

// A savepoint of a pipeline is refused (the later stages' state is not in
// the app's changelog), saying so.
func TestSavepointOfPipelineRefused(t *testing.T) {
	brokers, cl := wordcountCluster(t)
	env := aggregateEnv(t, brokers, "wcsp")
	env["SLUICE_JOB"], env["SLUICE_INPUT_TOPICS"], env["SLUICE_OUTPUT_TOPIC"] = "wordcount", "lines", "counts"
	s := startServe(t, env)
	words := map[string]int{}
	produceLines(t, cl, rand.New(rand.NewPCG(1, 1)), 10, words)
	awaitCounts(t, brokers, total(words))
	var stdout, stderr bytes.Buffer
	code := takeSavepoint(context.Background(), map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "wcsp", "SLUICE_SAVEPOINT_DIR": t.TempDir()}, nil, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "savepoints of a pipeline of several stages are not supported yet") {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	s.stop(t)
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
