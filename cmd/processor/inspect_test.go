package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/groupview"
)

// runInspectJSON runs `processor inspect --json` in-process.
func runInspectJSON(t *testing.T, brokers, app string) inspection {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": app}
	if code := inspectApp(context.Background(), []string{"--json"}, env, &stdout, &stderr); code != 0 {
		t.Fatalf("inspect exited %d: %s", code, stderr.String())
	}
	var in inspection
	if err := json.Unmarshal(stdout.Bytes(), &in); err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, stdout.String())
	}
	return in
}

func runInspectText(t *testing.T, brokers, app string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := map[string]string{"SLUICE_BROKERS": brokers, "SLUICE_APP_ID": app}
	if code := inspectApp(context.Background(), nil, env, &stdout, &stderr); code != 0 {
		t.Fatalf("inspect exited %d: %s", code, stderr.String())
	}
	return stdout.String()
}

// Inspect of a running app: its member, and per task the last epoch with
// marker, committed offset and input end agreeing once all input is
// processed (outputs, offsets and markers commit in one transaction).
func TestInspectRunningApp(t *testing.T) {
	for _, protocol := range groupProtocols {
		t.Run(protocol, func(t *testing.T) { testInspectRunningApp(t, protocol) })
	}
}

func testInspectRunningApp(t *testing.T, protocol string) {
	brokers, cl := savepointCluster(t)
	env := aggregateEnv(t, brokers, "insp")
	env["SLUICE_GROUP_PROTOCOL"] = protocol
	inst := startServe(t, env)
	inst.awaitReady(t)
	var in inputLog
	in.produce(t, cl, rand.New(rand.NewPCG(9, 10)), 400)
	awaitOutputs(t, brokers, in.n)

	got := runInspectJSON(t, brokers, "insp")
	if got.App != "insp" || got.ChangelogTopic != "insp-changelog" || got.Group.Protocol != protocol ||
		len(got.Group.Members) != 1 || got.Group.Members[0].InstanceID != "i1" {
		t.Fatalf("group: %+v", got.Group)
	}
	if a := got.Group.Members[0].Assigned["in"]; len(a) != 4 {
		t.Errorf("member assigned %v, want the 4 partitions of in", got.Group.Members[0].Assigned)
	}
	if len(got.Tasks) != 4 {
		t.Fatalf("tasks: %+v", got.Tasks)
	}
	for _, task := range got.Tasks {
		n := int64(len(in.recs[task.Partition]))
		if len(task.Inputs) != 1 {
			t.Fatalf("task %d inputs: %+v", task.Partition, task.Inputs)
		}
		row := task.Inputs[0]
		if n > 0 && (task.Epoch == 0 || task.MarkerOffset < 0) {
			t.Errorf("task %d: epoch %d at marker offset %d, want a committed epoch", task.Partition, task.Epoch, task.MarkerOffset)
		}
		if row.Topic != "in" || row.Marker != n || row.Committed != n || row.End != n || row.Lag != 0 {
			t.Errorf("task %d: %+v, want marker = committed = end = %d, lag 0", task.Partition, row, n)
		}
		if task.ChangelogRecords <= 0 || task.ChangelogRecords != task.ChangelogEnd-task.ChangelogStart {
			t.Errorf("task %d: changelog %d..%d, %d records", task.Partition, task.ChangelogStart, task.ChangelogEnd, task.ChangelogRecords)
		}
	}
	text := runInspectText(t, brokers, "insp")
	for _, want := range []string{"group insp: Stable, " + protocol + " protocol, 1 member", "i1", "tasks (changelog insp-changelog, 4 partitions)", "TASK  EPOCH  INPUT"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}
	inst.stop(t)

	// Stopped, the group has no members; the tasks stay as they were.
	got = runInspectJSON(t, brokers, "insp")
	if len(got.Group.Members) != 0 || len(got.Tasks) != 4 {
		t.Fatalf("after stop: group %+v, %d tasks", got.Group, len(got.Tasks))
	}
	for _, task := range got.Tasks {
		if row := task.Inputs[0]; row.Lag != 0 || row.Marker != int64(len(in.recs[task.Partition])) {
			t.Errorf("after stop, task %d: %+v", task.Partition, row)
		}
	}
	// Input produced while it is stopped is lag.
	more := inputLog{}
	more.produce(t, cl, rand.New(rand.NewPCG(13, 14)), 100)
	got = runInspectJSON(t, brokers, "insp")
	lag := int64(0)
	for _, task := range got.Tasks {
		row := task.Inputs[0]
		n := int64(len(in.recs[task.Partition]))
		if row.Committed != n || row.End != n+int64(len(more.recs[task.Partition])) || row.Lag != row.End-n {
			t.Errorf("task %d with new input: %+v", task.Partition, row)
		}
		lag += row.Lag
	}
	if lag != 100 {
		t.Errorf("lag %d, want the 100 records produced since", lag)
	}
	t.Logf("inspect of a stopped app:\n%s", runInspectText(t, brokers, "insp"))
}

// An app with standby replicas: inspect shows the group's assignor and
// each member's standby tasks, which are the tasks the other member runs;
// a state query with stale=true is answered by the instance keeping a
// standby of the key's task, with what its owner answers once the
// standby has read the last epoch.
func TestInspectShowsStandbys(t *testing.T) {
	brokers, cl := savepointCluster(t)
	var insts []*served
	for _, id := range []string{"i1", "i2"} {
		env := aggregateEnv(t, brokers, "sb")
		env["SLUICE_INSTANCE_ID"], env["SLUICE_STANDBY_REPLICAS"], env["SLUICE_RACK"] = id, "1", "zone-"+id
		insts = append(insts, startServe(t, env))
	}
	for _, s := range insts {
		s.awaitReady(t)
	}
	var got inspection
	deadline := time.Now().Add(time.Minute)
	for {
		got = runInspectJSON(t, brokers, "sb")
		ms := got.Group.Members
		if got.Group.State == "Stable" && len(ms) == 2 && len(ms[0].Assigned["in"]) == 2 && len(ms[1].Assigned["in"]) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group did not settle on two members of 2 tasks each: %+v", got.Group)
		}
		<-time.After(50 * time.Millisecond) // polling the group, with a deadline
	}
	if got.Group.Assignor != "sluice-standby-v1" {
		t.Fatalf("assignor %q, want sluice-standby-v1", got.Group.Assignor)
	}
	for i, m := range got.Group.Members {
		if m.Rack != "zone-"+m.InstanceID {
			t.Errorf("%s's rack %q, want zone-%s (SLUICE_RACK)", m.InstanceID, m.Rack, m.InstanceID)
		}
		other := got.Group.Members[1-i]
		if !slices.Equal(m.Standby, other.Assigned["in"]) {
			t.Errorf("%s stands by for %v, want the tasks %s runs, %v", m.InstanceID, m.Standby, other.InstanceID, other.Assigned["in"])
		}
	}
	text := runInspectText(t, brokers, "sb")
	for _, want := range []string{"2 members, assignor sluice-standby-v1", "STANDBY TASKS"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}
	for _, m := range got.Group.Members {
		row := []string{m.InstanceID, m.Host, m.ClientID, m.Rack, "in:" + tasksList(m.Assigned["in"]), tasksList(m.Standby), tasksList(m.Warmup), m.MemberID}
		if !slices.ContainsFunc(strings.Split(text, "\n"), func(line string) bool { return slices.Equal(strings.Fields(line), row) }) {
			t.Errorf("inspect output lacks the row %q:\n%s", row, text)
		}
	}

	var in inputLog
	in.produce(t, cl, rand.New(rand.NewPCG(5, 6)), 300)
	awaitOutputs(t, brokers, in.n)
	for p, recs := range in.recs {
		key := string(recs[len(recs)-1].Key)
		path := "/state/aggregate?key=" + url.QueryEscape(key)
		owner, other := insts[0], insts[1] // i1, i2
		if i := slices.IndexFunc(got.Group.Members, func(m groupview.Member) bool { return m.InstanceID == "i1" }); !slices.Contains(got.Group.Members[i].Assigned["in"], p) {
			owner, other = other, owner
		}
		var want queryAnswer
		if code := getJSON(t, owner.metrics, path, &want); code != http.StatusOK || want.Standby {
			t.Fatalf("%s from its owner: %d %+v", key, code, want)
		}
		var ans queryAnswer
		if code := getJSON(t, other.metrics, path+"&from=test", &ans); code != http.StatusMisdirectedRequest {
			t.Fatalf("%s from the other instance without stale: %d %+v, want 421", key, code, ans)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			ans = queryAnswer{}
			code := getJSON(t, other.metrics, path+"&stale=true", &ans)
			if code == http.StatusOK && ans.Standby && string(ans.Value) == string(want.Value) {
				if ans.StandbyLag == nil || *ans.StandbyLag < 0 {
					t.Fatalf("%s, stale, from its standby: standby_lag %v, want a lag", key, ans.StandbyLag)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s, stale, from its standby: %d %+v; its owner answers %s", key, code, ans, want.Value)
			}
			<-time.After(20 * time.Millisecond) // polling the standby, with a deadline
		}
	}
	for _, bad := range []string{"aggregate?key=k1&stale=maybe", "nosuchstate?key=k1&stale=maybe", "aggregate?list&stale=true"} {
		var ans queryAnswer
		if code := getJSON(t, insts[0].metrics, "/state/"+bad, &ans); code != http.StatusBadRequest || ans.Error == "" {
			t.Fatalf("%s: %d %+v, want 400", bad, code, ans)
		}
	}
}

// A producer that dies mid-transaction leaves it open: inspect lists it
// with its state, age and timeout, and lag shows the unprocessed input.
func TestInspectShowsOpenTransaction(t *testing.T) {
	brokers, _ := savepointCluster(t)
	zombie, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.TransactionalID("txapp-i1"), kgo.TransactionTimeout(5*time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	if err := zombie.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := zombie.ProduceSync(context.Background(), &kgo.Record{Topic: "out", Partition: 0, Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	zombie.Close() // no EndTransaction: the transaction stays open until its timeout
	// Another app's transaction with a name that only looks alike.
	other, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.TransactionalID("txapp2-i1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := other.ProduceSync(context.Background(), &kgo.Record{Topic: "out", Value: []byte("y")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	got := runInspectJSON(t, brokers, "txapp")
	if len(got.Transactions) != 1 {
		t.Fatalf("transactions: %+v", got.Transactions)
	}
	x := got.Transactions[0]
	if x.ID != "txapp-i1" || x.State != "Ongoing" || x.timeout() != 5*time.Minute || x.Hanging ||
		x.Started.IsZero() || x.AgeMs < 0 || x.age() > time.Since(before)+time.Minute || strings.Join(x.Partitions, ",") != "out/0" {
		t.Fatalf("transaction: %+v", x)
	}
	if got.Group.State != "Dead" || len(got.Tasks) != 0 || len(got.Notes) != 1 {
		t.Errorf("an app that never ran: group %+v, tasks %+v, notes %v", got.Group, got.Tasks, got.Notes)
	}
	text := runInspectText(t, brokers, "txapp")
	for _, want := range []string{"open transactions of txapp-*: 1", "txapp-i1", "Ongoing", "5m0s", "no changelog topic txapp-changelog"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}
	t.Logf("inspect with an open transaction:\n%s", text)
}

func TestHanging(t *testing.T) {
	tests := []struct {
		state        string
		age, timeout time.Duration
		want         bool
	}{
		{"Ongoing", 11 * time.Second, 10 * time.Second, true},
		{"Ongoing", 10 * time.Second, 10 * time.Second, false},
		{"PrepareCommit", time.Hour, time.Minute, true},
		{"CompleteCommit", time.Hour, time.Minute, false},
		{"Empty", time.Hour, time.Minute, false},
		{"Ongoing", time.Hour, 0, false},
	}
	for _, tt := range tests {
		if got := hanging(tt.state, tt.age, tt.timeout); got != tt.want {
			t.Errorf("hanging(%s, %v, %v) = %v, want %v", tt.state, tt.age, tt.timeout, got, tt.want)
		}
	}
}

func TestInspectBadEnvironmentExitsTwo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := inspectApp(context.Background(), nil, map[string]string{"SLUICE_APP_ID": "a"}, &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "SLUICE_BROKERS") || strings.Count(stderr.String(), "\n") != 1 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	// The binary's wiring of both commands: a bad variable exits 2, an
	// unknown flag too.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect"}, "SLUICE_APP_ID"},
		{[]string{"reset", "--yes"}, "SLUICE_APP_ID"},
		{[]string{"inspect", "--no-such-flag"}, "no-such-flag"},
		{[]string{"reset", "--no-such-flag"}, "no-such-flag"},
	} {
		cmd := exec.Command(binary, tt.args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "SLUICE_BROKERS=127.0.0.1:1", "SLUICE_APP_ID=no/slash"}
		out, err := cmd.CombinedOutput()
		if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 2 || !strings.Contains(string(out), tt.want) {
			t.Errorf("processor %v: %v, output %q", tt.args, err, out)
		}
	}
}
