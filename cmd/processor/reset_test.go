package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/groupview"
)

func runResetWith(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = resetApp(context.Background(), args, env, &out, &errOut)
	return code, out.String(), errOut.String()
}

// topicNames lists the topics with a new client: a client answers a
// repeated metadata request from its cache for a while.
func topicNames(t *testing.T, brokers string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return details.Names()
}

// The whole life of a reset: refused while an instance runs, a dry run that
// deletes nothing, a reset that deletes the group, the internal topics and
// the state dir but not the output or the DLQ, and an app that then starts
// from scratch: it reprocesses its input from the earliest offset with
// empty state.
func TestReset(t *testing.T) {
	brokers, cl := savepointCluster(t)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	env := aggregateEnv(t, brokers, "rst")
	resetEnv := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "rst", "SLUICE_STATE_DIR": env["SLUICE_STATE_DIR"]}
	stateDir := filepath.Join(env["SLUICE_STATE_DIR"], "rst")

	inst := startServe(t, env)
	inst.awaitReady(t)
	var in inputLog
	in.produce(t, cl, rand.New(rand.NewPCG(11, 12)), 300)
	awaitOutputs(t, brokers, in.n)
	// Topics a reset also deletes (a control topic, a repartition topic)
	// and one it must not (another app's whose id merely starts alike).
	if _, err := adm.CreateTopics(ctx, 1, 1, nil, "rst-control", "rst-words-repartition", "rstx-changelog"); err != nil {
		t.Fatal(err)
	}

	// Refused while the group has a member, dry run or not.
	for _, args := range [][]string{nil, {"--yes"}} {
		code, stdout, stderr := runResetWith(t, resetEnv, args...)
		if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "group rst has 1 member (i1): stop every instance first") {
			t.Fatalf("reset %v with a member: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	inst.stop(t)

	// The dry run lists everything and deletes nothing.
	code, stdout, stderr := runResetWith(t, resetEnv)
	if code != 0 {
		t.Fatalf("dry run: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"dry run: nothing deleted", "would delete consumer group rst", "would delete topic rst-changelog", "would delete topic rst-control",
		"would delete topic rst-words-repartition", "would delete state dir " + stateDir, "kept: the output topics and the DLQ topic (rst-dlq"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("dry run output lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "rstx-changelog") || strings.Contains(stdout, "topic out") || strings.Contains(stdout, "topic rst-dlq") {
		t.Errorf("dry run would delete a topic that is not the app's:\n%s", stdout)
	}
	t.Logf("processor reset:\n%s", stdout)
	if g, err := groupview.Describe(ctx, cl, adm, "rst"); err != nil || g.State == "Dead" {
		t.Fatalf("group after the dry run: %+v, %v", g, err)
	}
	if names := topicNames(t, brokers); !slices.Contains(names, "rst-changelog") || !slices.Contains(names, "rst-control") {
		t.Fatalf("topics after the dry run: %v", names)
	}
	if _, err := os.Stat(stateDir); err != nil {
		t.Fatalf("state dir after the dry run: %v", err)
	}

	code, stdout, stderr = runResetWith(t, resetEnv, "--yes")
	if code != 0 || !strings.Contains(stdout, "deleted topic rst-changelog") || !strings.Contains(stdout, "deleted state dir") {
		t.Fatalf("reset --yes: exit %d, stdout %s, stderr %s", code, stdout, stderr)
	}
	if g, err := groupview.Describe(ctx, cl, adm, "rst"); err != nil || g.State != "Dead" {
		t.Fatalf("group after the reset: %+v, %v", g, err)
	}
	names := topicNames(t, brokers)
	for _, gone := range []string{"rst-changelog", "rst-control", "rst-words-repartition"} {
		if slices.Contains(names, gone) {
			t.Errorf("%s still there after the reset: %v", gone, names)
		}
	}
	for _, kept := range []string{"in", "out", "rst-dlq", "rstx-changelog"} {
		if !slices.Contains(names, kept) {
			t.Errorf("%s deleted by the reset: %v", kept, names)
		}
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Fatalf("state dir after the reset: %v", err)
	}
	// Nothing left: a second reset says so.
	if code, stdout, _ := runResetWith(t, resetEnv, "--yes"); code != 0 || !strings.Contains(stdout, "nothing to delete") {
		t.Fatalf("second reset: exit %d, %s", code, stdout)
	}

	// The app starts fresh: every input is processed again from empty
	// state, so each key's last aggregate counts its inputs once.
	inst = startServe(t, env)
	inst.awaitReady(t)
	recs, err := check.ReadCommitted(ctx, []string{brokers}, "out", 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= 2*in.n })
	if err != nil || len(recs) != 2*in.n {
		t.Fatalf("outputs after the reset: %d, want %d (%v)", len(recs), 2*in.n, err)
	}
	last := map[string]int64{}
	for _, r := range recs {
		var agg struct{ Count int64 }
		if err := json.Unmarshal(r.Value, &agg); err != nil {
			t.Fatal(err)
		}
		last[string(r.Key)] = agg.Count
	}
	want := map[string]int64{}
	for _, recs := range in.recs {
		for _, r := range recs {
			want[string(r.Key)]++
		}
	}
	for k, n := range want {
		if last[k] != n {
			t.Errorf("key %s: last count %d after the reset, want %d (state not fresh)", k, last[k], n)
		}
	}
	inst.stop(t)
}

// The member check sees the members of a KIP-848 group too, whose
// DescribeGroups answer is not the classic one.
func TestResetRefusesWithConsumerGroupMembers(t *testing.T) {
	brokers, _ := savepointCluster(t)
	env := aggregateEnv(t, brokers, "rst848")
	env["SLUICE_GROUP_PROTOCOL"] = "consumer"
	inst := startServe(t, env)
	inst.awaitReady(t)
	code, stdout, stderr := runResetWith(t, map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": "rst848", "SLUICE_STATE_DIR": env["SLUICE_STATE_DIR"]}, "--yes")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "group rst848 has 1 member (i1)") {
		t.Fatalf("reset with a member: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if names := topicNames(t, brokers); !slices.Contains(names, "rst848-changelog") {
		t.Fatalf("topics after a refused reset: %v", names)
	}
	inst.stop(t)
}

func TestIsInternalTopic(t *testing.T) {
	tests := []struct {
		topic string
		want  bool
	}{
		{"app-changelog", true},
		{"app-control", true},
		{"app-words-repartition", true},
		{"app-a-b-repartition", true},
		{"app-repartition", false},
		{"app--repartition", false},
		{"app-dlq", false},
		{"app", false},
		{"appx-changelog", false},
		{"out", false},
	}
	for _, tt := range tests {
		if got := isInternalTopic("app", tt.topic); got != tt.want {
			t.Errorf("isInternalTopic(app, %s) = %v, want %v", tt.topic, got, tt.want)
		}
	}
}

func TestResetBadEnvironmentExitsTwo(t *testing.T) {
	code, stdout, stderr := runResetWith(t, map[string]string{"SLUICE_BROKERS": "127.0.0.1:1"})
	if code != 2 || stdout != "" || !strings.Contains(stderr, "SLUICE_APP_ID") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
