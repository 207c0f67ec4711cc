package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
)

// aclCase is one instance of TestLeastPrivilegeACLs, authenticating as its
// own SCRAM user, whose ACLs are sluice.Options.ACLs of its configuration
// (the README's table) less the missing one.
type aclCase struct {
	aclVariant
	name    string
	app     string
	env     map[string]string
	granted []sluice.ACL
	missing *sluice.ACL // nil: the instance must run
}

type aclVariant struct {
	guarantee string
	drop      int  // index in the ACLs of the one missing; -1 for none
	revoke    bool // the dropped ACL is granted, then withdrawn while the instance runs
	idle      bool // and no input comes after the withdrawal
	binary    bool // run the processor binary, not serve in this process
}

// TestLeastPrivilegeACLs runs instances against one kfake broker with SASL
// and ACLs on. With every ACL of the least-privilege set (docs/security.md) the job
// runs exactly once (and at-least-once without the transactional id); with
// any one of them missing, or withdrawn while it runs, the instance stops
// within a bound with an error naming that ACL, instead of retrying. The
// binary exits 1 with one line doing the same, and on a wrong password.
func TestLeastPrivilegeACLs(t *testing.T) {
	var cases []*aclCase
	add := func(name string, v aclVariant) *aclCase {
		app := fmt.Sprintf("acl%d", len(cases))
		c := &aclCase{aclVariant: v, name: name, app: app}
		input := "in"
		if v.revoke {
			input = app + "-in" // fed again after the withdrawal
		}
		c.env = map[string]string{
			"SLUICE_APP_ID": app, "SLUICE_JOB": "aggregate", "SLUICE_INSTANCE_ID": "i1",
			"SLUICE_INPUT_TOPICS": input, "SLUICE_OUTPUT_TOPIC": app + "-out",
			// Port 0: nothing here reads the endpoints, and a port picked
			// ahead for each of the cases could be taken by the time its
			// case runs.
			"SLUICE_STATE_DIR": t.TempDir(), "SLUICE_METRICS_ADDR": "127.0.0.1:0",
			"SLUICE_GUARANTEE": v.guarantee, "SLUICE_SESSION_TIMEOUT": "6s",
			"SLUICE_SASL_MECHANISM": "SCRAM-SHA-256", "SLUICE_SASL_USERNAME": app, "SLUICE_SASL_PASSWORD": "pw-" + app,
		}
		cfg, err := loadConfig(c.env, jobSpecs())
		if err != nil {
			t.Fatal(err)
		}
		need := engineOptions(cfg, nil, nil).ACLs()
		for i, a := range need {
			if i == v.drop {
				c.missing = &need[i]
				c.name = fmt.Sprintf("%s %s", name, a)
				if !v.revoke {
					continue
				}
			}
			c.granted = append(c.granted, a)
		}
		cases = append(cases, c)
		return c
	}
	eos := func(drop int) aclVariant { return aclVariant{guarantee: "exactly_once", drop: drop} }
	need := add("all ACLs exactly once", eos(-1)).granted
	add("all ACLs at least once", aclVariant{guarantee: "at_least_once", drop: -1})
	for i := range need {
		add("without", eos(i))
	}
	index := func(rt kmsg.ACLResourceType, op kmsg.ACLOperation, suffix string) int {
		for i, a := range need {
			if a.Resource == rt && a.Operation == op && strings.HasSuffix(a.Name, suffix) {
				return i
			}
		}
		t.Fatalf("no %v %v *%s in %v", op, rt, suffix, need)
		return -1
	}
	group := index(kmsg.ACLResourceTypeGroup, kmsg.ACLOperationRead, "")
	output := index(kmsg.ACLResourceTypeTopic, kmsg.ACLOperationWrite, "-out")
	txnID := index(kmsg.ACLResourceTypeTransactionalId, kmsg.ACLOperationWrite, "")
	for _, drop := range []int{group, output, txnID} {
		add("withdrawn while running:", aclVariant{guarantee: "exactly_once", drop: drop, revoke: true})
	}
	add("withdrawn while idle:", aclVariant{guarantee: "exactly_once", drop: group, revoke: true, idle: true})
	add("binary without", aclVariant{guarantee: "exactly_once", drop: txnID, binary: true})
	wrongPassword := add("binary with a wrong password", aclVariant{guarantee: "exactly_once", drop: -1, binary: true})

	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "admin"), kfake.SeedTopics(2, "in")}
	for _, c := range cases {
		var acls []kfake.ACL
		for _, a := range c.granted {
			acls = append(acls, kfake.ACL{Resource: a.Resource, Name: a.Name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: a.Operation, Allow: true})
		}
		password := c.env["SLUICE_SASL_PASSWORD"]
		if c == wrongPassword {
			password = "the-right-one"
		}
		opts = append(opts, kfake.User("SCRAM-SHA-256", c.app, password, acls...))
		if c.revoke {
			opts = append(opts, kfake.SeedTopics(2, c.env["SLUICE_INPUT_TOPICS"]))
		}
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()[0]
	for _, c := range cases {
		c.env["SLUICE_BROKERS"] = brokers
	}
	admin := newSuperUser(t, brokers)
	inputs := produceInts(t, admin.cl, "in", 40, 1)

	t.Run("cases", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				switch {
				case c == wrongPassword:
					runBinaryExpectingError(t, c.env, "authentication with the brokers failed", "SLUICE_SASL_USERNAME="+c.app)
				case c.binary:
					runBinaryExpectingError(t, c.env, "missing ACL: "+c.missing.String())
				case c.missing == nil:
					in := startServe(t, c.env)
					admin.expectOutput(t, c.app, inputs, 1)
					in.stop(t)
				case c.revoke:
					in := startServe(t, c.env)
					input := c.env["SLUICE_INPUT_TOPICS"]
					admin.expectOutput(t, c.app, produceInts(t, admin.cl, input, 20, 0), 0)
					admin.withdraw(t, c.app, *c.missing)
					if !c.idle {
						produceInts(t, admin.cl, input, 20, 0)
					}
					expectMissing(t, in.wait(t), *c.missing)
				default:
					expectMissing(t, startServe(t, c.env).wait(t), *c.missing)
				}
			})
		}
	})
}

// superUser is a client of the broker's superuser, who reads and writes
// every topic and changes ACLs.
type superUser struct {
	brokers string
	opts    []kgo.Opt
	cl      *kgo.Client
}

func newSuperUser(t *testing.T, brokers string) *superUser {
	t.Helper()
	opts := []kgo.Opt{kgo.SASL(scram.Auth{User: "admin", Pass: "admin"}.AsSha256Mechanism())}
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(brokers))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &superUser{brokers: brokers, opts: opts, cl: cl}
}

// produceInts writes n base-10 integers over ten keys, then bad records
// that do not parse (the aggregate job's dead letters), and returns the
// valid ones by key.
func produceInts(t *testing.T, cl *kgo.Client, topic string, n, bad int) map[string][]int64 {
	t.Helper()
	inputs := map[string][]int64{}
	var recs []*kgo.Record
	for i := range n {
		key := "k" + strconv.Itoa(i%10)
		inputs[key] = append(inputs[key], int64(i))
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(strconv.Itoa(i))})
	}
	for range bad {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("bad"), Value: []byte("not a number")})
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return inputs
}

// expectOutput reads app's output and dead letters until they reflect every
// input, and checks them exactly once.
func (s *superUser) expectOutput(t *testing.T, app string, inputs map[string][]int64, deadLetters int) {
	t.Helper()
	want := 0
	for _, vs := range inputs {
		want += len(vs)
	}
	recs, err := check.ReadCommitted(context.Background(), []string{s.brokers}, app+"-out", 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= want }, s.opts...)
	if err != nil {
		t.Fatal(err)
	}
	if rep := check.Aggregate(inputs, recs); !rep.OK() || rep.Inputs != want {
		t.Fatalf("output of %s: %v", app, rep)
	}
	if deadLetters == 0 {
		return
	}
	dlq, err := check.ReadCommitted(context.Background(), []string{s.brokers}, app+"-dlq", 30*time.Second,
		func(r []*kgo.Record) bool { return len(r) >= deadLetters }, s.opts...)
	if err != nil || len(dlq) != deadLetters {
		t.Fatalf("dead letters of %s: %d (want %d), %v", app, len(dlq), deadLetters, err)
	}
}

// withdraw deletes one ACL of app's user.
func (s *superUser) withdraw(t *testing.T, app string, a sluice.ACL) {
	t.Helper()
	req := kmsg.NewPtrDeleteACLsRequest()
	f := kmsg.NewDeleteACLsRequestFilter()
	f.ResourceType = a.Resource
	f.ResourceName = kmsg.StringPtr(a.Name)
	f.ResourcePatternType = kmsg.ACLResourcePatternTypeLiteral
	f.Principal = kmsg.StringPtr("User:" + app)
	f.Host = kmsg.StringPtr("*")
	f.Operation = a.Operation
	f.PermissionType = kmsg.ACLPermissionTypeAllow
	req.Filters = append(req.Filters, f)
	resp, err := req.RequestWith(context.Background(), s.cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Results {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil || len(r.MatchingACLs) != 1 {
			t.Fatalf("withdraw %s: %v, %d matching", a, err, len(r.MatchingACLs))
		}
	}
}

func expectMissing(t *testing.T, err error, want sluice.ACL) {
	t.Helper()
	t.Logf("stopped with: %v", err)
	var pe *sluice.PermissionError
	if !errors.As(err, &pe) {
		t.Fatalf("stopped with %v, want a missing %s", err, want)
	}
	if pe.ACL.Resource != want.Resource || pe.ACL.Name != want.Name || pe.ACL.Operation != want.Operation {
		t.Fatalf("stopped with %q, want the missing %s", err, want)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "missing ACL: "+want.String()) || strings.Contains(msg, "\n") {
		t.Fatalf("error %q: want one line starting with %q", msg, "missing ACL: "+want.String())
	}
}

// runBinaryExpectingError runs the processor binary with environ and expects
// it to exit 1 within the bound with exactly one error line, which contains
// every one of want, and no retries.
func runBinaryExpectingError(t *testing.T, environ map[string]string, want ...string) {
	t.Helper()
	cmd := exec.Command(binary)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range environ {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(stopBound):
		cmd.Process.Kill()
		<-exited
		t.Fatalf("still running after %v (a retry loop?); log:\n%s", stopBound, stderr.String())
	}
	out := stderr.String()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1; log:\n%s", err, out)
	}
	var errorLines []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			errorLines = append(errorLines, line)
		}
		if strings.Contains(line, "retrying") || strings.Contains(line, "rebuilding") {
			t.Errorf("retried: %s", line)
		}
	}
	if len(errorLines) != 1 {
		t.Fatalf("want one error line, got %d; log:\n%s", len(errorLines), out)
	}
	for _, w := range want {
		if !strings.Contains(errorLines[0], strconv.Quote(w)[1:len(strconv.Quote(w))-1]) {
			t.Errorf("error line %s does not say %q", errorLines[0], w)
		}
	}
	if p := environ["SLUICE_SASL_PASSWORD"]; p != "" && strings.Contains(out, p) {
		t.Errorf("the log shows the password:\n%s", out)
	}
}
