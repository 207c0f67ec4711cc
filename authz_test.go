package sluice

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/txsink"
)

func authzConfig() Options {
	return Options{
		Brokers:     []string{"127.0.0.1:9092"},
		AppID:       "app",
		InstanceID:  "i1",
		Job:         Job{Name: "job", Emits: true, Process: func(Context, *Record) error { return nil }},
		InputTopics: []string{"in"},
		OutputTopic: "out",
		Guarantee:   ExactlyOnce,
		Checkpoint: barrier.Config{
			Interval: 100 * time.Millisecond,
			Timeout:  time.Second,
		},
		TransactionTimeout: 10 * time.Second,
		SessionTimeout:     6 * time.Second,
		RebalanceTimeout:   4 * time.Second,
	}
}

func authzInstance(t *testing.T) *Instance {
	t.Helper()
	in, err := New(authzConfig())
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func aclList(acls []ACL) string {
	var lines []string
	for _, a := range acls {
		lines = append(lines, a.String())
	}
	return strings.Join(lines, "\n")
}

func TestConfigACLs(t *testing.T) {
	const (
		in       = `READ on topic "in"`
		clCreate = `CREATE on topic "app-changelog"`
		clConfig = `DESCRIBE_CONFIGS on topic "app-changelog"`
		clWrite  = `WRITE on topic "app-changelog"`
		clRead   = `READ on topic "app-changelog"`
		ctCr     = `CREATE on topic "app-control"`
		ctRead   = `READ on topic "app-control"`
		outCr    = `CREATE on topic "out"`
		outCfg   = `DESCRIBE_CONFIGS on topic "out"`
		out      = `WRITE on topic "out"`
		dlqCr    = `CREATE on topic "app-dlq"`
		dlqCfg   = `DESCRIBE_CONFIGS on topic "app-dlq"`
		dlq      = `WRITE on topic "app-dlq"`
		group    = `READ on group "app"`
		txn      = `WRITE on transactional-id "app-i1"`
	)
	tests := []struct {
		name   string
		modify func(*Options)
		want   []string
	}{
		{"exactly once, topics created", func(*Options) {}, []string{in, clCreate, clConfig, clWrite, clRead, ctCr, ctRead, outCr, outCfg, out, dlqCr, dlqCfg, dlq, group, txn}},
		{"topics not created", func(c *Options) { c.DisableTopicCreation = true }, []string{in, clConfig, clWrite, clRead, ctRead, outCfg, out, dlqCfg, dlq, group, txn}},
		{"at least once", func(c *Options) { c.Guarantee = AtLeastOnce; c.DisableTopicCreation = true }, []string{in, clConfig, clWrite, clRead, ctRead, outCfg, out, dlqCfg, dlq, group}},
		{"no output, own dead-letter topic", func(c *Options) { c.OutputTopic = ""; c.DLQTopic = "bad"; c.DisableTopicCreation = true },
			[]string{in, clConfig, clWrite, clRead, ctRead, `DESCRIBE_CONFIGS on topic "bad"`, `WRITE on topic "bad"`, group, txn}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := authzConfig()
			tt.modify(&c)
			acls := c.ACLs()
			if got, want := aclList(acls), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("ACLs() =\n%s\nwant\n%s", got, want)
			}
			for _, a := range acls {
				if a.Why == "" {
					t.Errorf("%s has no reason", a)
				}
				if a.Operation == kmsg.ACLOperationDescribe {
					t.Errorf("%s is implied by READ or WRITE; the set must not list it", a)
				}
			}
		})
	}
}

func TestRefusal(t *testing.T) {
	in := authzInstance(t)
	txnACL := ACL{Resource: kmsg.ACLResourceTypeTransactionalId, Name: "app-i1", Operation: kmsg.ACLOperationWrite}
	groupACL := ACL{Resource: kmsg.ACLResourceTypeGroup, Name: "app", Operation: kmsg.ACLOperationRead}
	clusterACL := ACL{Resource: kmsg.ACLResourceTypeCluster, Name: "kafka-cluster", Operation: kmsg.ACLOperationIdempotentWrite}
	already := &PermissionError{ACL: ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "x", Operation: kmsg.ACLOperationCreate, Why: "create it"}, Err: kerr.TopicAuthorizationFailed}
	tests := []struct {
		name         string
		err          error
		want         *ACL // a *PermissionError for it
		auth         bool // an *AuthError
		topicRefused bool
	}{
		{"nil", nil, nil, false, false},
		{"begin after a refused InitProducerID", fmt.Errorf("%w: begin: %w", errSessionBroken,
			fmt.Errorf("producer ID has a fatal, unrecoverable error, err: %w", kerr.TransactionalIDAuthorizationFailed)), &txnACL, false, false},
		{"epoch aborted by EndTxn", fmt.Errorf("%w: %w", errSessionBroken, &barrier.CheckpointError{Cause: kerr.TransactionalIDAuthorizationFailed}), &txnACL, false, false},
		{"group session", &kgo.ErrGroupSession{Err: kerr.GroupAuthorizationFailed}, &groupACL, false, false},
		{"idempotent producer", fmt.Errorf("%w: out/0: %w", txsink.ErrProduce, kerr.ClusterAuthorizationFailed), &clusterACL, false, false},
		{"already named", fmt.Errorf("startup: %w", already), &already.ACL, false, false},
		{"produce to a topic", fmt.Errorf("%w: out/0: %w", txsink.ErrProduce, kerr.TopicAuthorizationFailed), nil, false, true},
		{"SASL refused", fmt.Errorf("unable to dial: %w: Authentication failed", kerr.SaslAuthenticationFailed), nil, true, false},
		{"SASL mechanism", kerr.UnsupportedSaslMechanism, nil, true, false},
		{"broker certificate untrusted", fmt.Errorf("unable to dial: %w", x509.UnknownAuthorityError{}), nil, true, false},
		{"broker certificate for another host", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "kafka"}, nil, true, false},
		{"client certificate refused", &net.OpError{Op: "remote error", Err: errors.New("tls: certificate required")}, nil, true, false},
		{"connection refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, nil, false, false},
		{"connection closed", io.EOF, nil, false, false},
		{"fenced", kerr.ProducerFenced, nil, false, false},
		{"deadline", context.DeadlineExceeded, nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			final, topicRefused := in.refusal(tt.err)
			if topicRefused != tt.topicRefused {
				t.Errorf("topicRefused = %v, want %v", topicRefused, tt.topicRefused)
			}
			var (
				pe *PermissionError
				ae *AuthError
			)
			switch {
			case tt.want != nil:
				if !errors.As(final, &pe) || pe.ACL.String() != tt.want.String() {
					t.Fatalf("refusal = %v, want a missing %s", final, tt.want)
				}
				if pe.ACL.Why == "" {
					t.Errorf("%s: no reason", pe.ACL)
				}
			case tt.auth:
				if !errors.As(final, &ae) || !errors.Is(final, tt.err) {
					t.Fatalf("refusal = %v, want an *AuthError wrapping %v", final, tt.err)
				}
			default:
				if final != nil {
					t.Fatalf("refusal = %v, want nil", final)
				}
			}
		})
	}
}

// A refused fetch names the topic itself; a refused group is the group.
func TestPollDenied(t *testing.T) {
	in := authzInstance(t)
	fetch := func(topic string, err error) kgo.Fetches {
		return kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: topic, Partitions: []kgo.FetchPartition{{Partition: 0, Err: err}}}}}}
	}
	tests := []struct {
		name string
		fs   kgo.Fetches
		want string
	}{
		{"fetch refused", fetch("in", kerr.TopicAuthorizationFailed), `missing ACL: READ on topic "in" (the broker answered TOPIC_AUTHORIZATION_FAILED)`},
		{"group refused", fetch("", &kgo.ErrGroupSession{Err: kerr.GroupAuthorizationFailed}), `missing ACL: READ on group "app" (the broker answered GROUP_AUTHORIZATION_FAILED)`},
		{"other fetch error", fetch("in", kerr.NotLeaderForPartition), ""},
		{"no error", kgo.Fetches{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := in.pollDenied(context.Background(), tt.fs)
			if got := fmt.Sprint(err); (tt.want == "" && err != nil) || (tt.want != "" && got != tt.want) {
				t.Errorf("pollDenied = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestPermissionErrorMessage(t *testing.T) {
	topic := ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "app-changelog", Operation: kmsg.ACLOperationDescribeConfigs}
	for _, tt := range []struct {
		err  *PermissionError
		want string
	}{
		{&PermissionError{ACL: topic, Err: kerr.TopicAuthorizationFailed},
			`missing ACL: DESCRIBE_CONFIGS on topic "app-changelog" (the broker answered TOPIC_AUTHORIZATION_FAILED)`},
		{&PermissionError{ACL: topic, Err: errNotAuthorized}, `missing ACL: DESCRIBE_CONFIGS on topic "app-changelog"`},
		{&PermissionError{ACL: ACL{Resource: kmsg.ACLResourceTypeTopic}, Err: fmt.Errorf("produce: %w", kerr.TopicAuthorizationFailed)},
			"missing ACL on one of the instance's topics; the broker did not say which, see the least-privilege set in docs/security.md (the broker answered TOPIC_AUTHORIZATION_FAILED)"},
	} {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() =\n%s\nwant\n%s", got, tt.want)
		}
		if !errors.Is(tt.err, tt.err.Err) {
			t.Errorf("%v does not unwrap to %v", tt.err, tt.err.Err)
		}
	}
}

func TestGrantedAndDescriber(t *testing.T) {
	read := int32(1 << kmsg.ACLOperationRead)
	if !granted(read, kmsg.ACLOperationRead) || granted(read, kmsg.ACLOperationWrite) {
		t.Error("granted misreads the bit field")
	}
	if !granted(math.MinInt32, kmsg.ACLOperationWrite) {
		t.Error("a broker that did not compute authorized operations must get the benefit of the doubt")
	}
	need := authzConfig().ACLs()
	for topic, want := range map[string]string{
		"in":            `READ on topic "in"`,
		"app-changelog": `WRITE on topic "app-changelog"`, // its first operation that implies DESCRIBE
		"out":           `WRITE on topic "out"`,
		"elsewhere":     `DESCRIBE on topic "elsewhere"`,
	} {
		if got := describer(need, topic).String(); got != want {
			t.Errorf("describer(%s) = %s, want %s", topic, got, want)
		}
	}
}

// Three connections in a row closed during SASL authentication refuse the
// credentials; one that gets past authentication starts the count again.
func TestSASLWatch(t *testing.T) {
	w := newSASLWatch()
	read := func(key kmsg.Key, err error) { w.OnBrokerRead(kgo.BrokerMetadata{}, int16(key), 0, 0, 0, err) }
	ctx, unbind := w.bind(context.Background())
	defer unbind()

	read(kmsg.SASLAuthenticate, io.EOF)
	read(kmsg.SASLAuthenticate, io.EOF)
	read(kmsg.Metadata, nil) // a connection authenticated
	read(kmsg.ApiVersions, nil)
	read(kmsg.SASLHandshake, nil)
	read(kmsg.SASLAuthenticate, nil) // SCRAM's first step
	read(kmsg.SASLAuthenticate, io.EOF)
	read(kmsg.Metadata, io.EOF) // a failed read does not count as authenticated
	read(kmsg.SASLAuthenticate, io.EOF)
	if w.err() != nil || ctx.Err() != nil {
		t.Fatalf("refused after two closes in a row: %v", w.err())
	}
	read(kmsg.SASLAuthenticate, io.EOF)
	var ae *AuthError
	if !errors.As(w.err(), &ae) {
		t.Fatalf("err() = %v, want an *AuthError", w.err())
	}
	<-ctx.Done()
	if !errors.As(context.Cause(ctx), &ae) {
		t.Fatalf("bound context's cause = %v, want the refusal", context.Cause(ctx))
	}
	if final, _ := (&Instance{sasl: w}).refusal(context.Canceled); final != w.err() {
		t.Errorf("refusal of an attempt cut short = %v, want the SASL refusal", final)
	}
}
