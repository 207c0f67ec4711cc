package sluice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Authorization. An instance needs exactly the ACLs Options.ACLs lists (the
// least-privilege set of docs/security.md is rendered from it). A refusal by the
// brokers' authorizer, or of the instance's credentials, is final: no retry
// grants an ACL or fixes a password, so Run stops with a *PermissionError or
// an *AuthError instead of retrying forever, and the error names what is
// missing.

// ACL is one permission an instance needs: an ALLOW ACL for the principal
// it authenticates as, granting Operation on the resource of type Resource
// named Name (literal pattern).
type ACL struct {
	Resource  kmsg.ACLResourceType
	Name      string
	Operation kmsg.ACLOperation
	Why       string // what the instance does with it
}

// String is the ACL as the one-line error names it, e.g.
// `WRITE on transactional-id "app-i1"`.
func (a ACL) String() string {
	return fmt.Sprintf("%s on %s %q", a.Operation, ResourceName(a.Resource), a.Name)
}

// ResourceName is a resource type as kafka-acls.sh spells its flag: topic,
// group, transactional-id, cluster.
func ResourceName(t kmsg.ACLResourceType) string {
	switch t {
	case kmsg.ACLResourceTypeTopic:
		return "topic"
	case kmsg.ACLResourceTypeGroup:
		return "group"
	case kmsg.ACLResourceTypeTransactionalId:
		return "transactional-id"
	case kmsg.ACLResourceTypeCluster:
		return "cluster"
	}
	return t.String()
}

// clusterName is the one name of the cluster resource.
const clusterName = "kafka-cluster"

// ACLs is the least-privilege set of ACLs the configured instance needs,
// in the order it first uses them. None is implied by another one
// (DESCRIBE is implied by READ and WRITE, so it is not listed). CREATE is
// needed only while a topic is missing and DisableTopicCreation is not set; the
// transactional id only exactly-once. At-least-once needs IDEMPOTENT_WRITE on
// the cluster only from brokers older than Kafka 2.8, where WRITE on a topic
// does not imply it.
func (c Options) ACLs() []ACL {
	topic := func(name string, op kmsg.ACLOperation, why string) ACL {
		return ACL{Resource: kmsg.ACLResourceTypeTopic, Name: name, Operation: op, Why: why}
	}
	var acls []ACL
	for _, t := range c.InputTopics {
		acls = append(acls, topic(t, kmsg.ACLOperationRead, "consume the input; commit its offsets with each epoch"))
	}
	create := func(name string) {
		if !c.DisableTopicCreation {
			acls = append(acls, topic(name, kmsg.ACLOperationCreate, "create the topic when it is missing"))
		}
	}
	changelogTopic := c.AppID + "-changelog"
	create(changelogTopic)
	acls = append(acls,
		topic(changelogTopic, kmsg.ACLOperationDescribeConfigs, "check that the changelog is compacted"),
		topic(changelogTopic, kmsg.ACLOperationWrite, "write each epoch's state changes and markers"),
		topic(changelogTopic, kmsg.ACLOperationRead, "restore state"),
	)
	if c.BroadcastTopic != "" {
		acls = append(acls, topic(c.BroadcastTopic, kmsg.ACLOperationRead, "read the broadcast topic whole"))
	}
	controlTopic := c.AppID + "-control"
	create(controlTopic)
	acls = append(acls, topic(controlTopic, kmsg.ACLOperationRead, "follow stop requests (processor savepoint --stop)"))
	dlq := c.DLQTopic
	if dlq == "" {
		dlq = c.AppID + "-dlq"
	}
	outputs := []string{dlq}
	if c.OutputTopic != "" {
		outputs = []string{c.OutputTopic, dlq}
	}
	for _, tag := range c.Job.SideOutputs {
		if t := c.SideOutputTopics[tag]; t != "" && !slices.Contains(outputs, t) {
			outputs = append(outputs, t)
		}
	}
	for _, t := range outputs {
		create(t)
		why := "write the job's output"
		if t == dlq {
			why = "write records the job cannot process"
		}
		acls = append(acls,
			topic(t, kmsg.ACLOperationDescribeConfigs, "size producer batches to the topic's max.message.bytes"),
			topic(t, kmsg.ACLOperationWrite, why))
	}
	acls = append(acls, ACL{Resource: kmsg.ACLResourceTypeGroup, Name: c.AppID, Operation: kmsg.ACLOperationRead,
		Why: "join the consumer group; commit offsets"})
	if c.Guarantee != AtLeastOnce {
		acls = append(acls, ACL{Resource: kmsg.ACLResourceTypeTransactionalId, Name: c.transactionalID(), Operation: kmsg.ACLOperationWrite,
			Why: "run one transaction per epoch"})
	}
	return acls
}

// PermissionError is an operation the brokers refused for want of an ACL.
// It is final: Run returns it rather than retrying.
type PermissionError struct {
	ACL ACL   // the missing permission; Name is "" when the brokers did not say which topic's
	Err error // the broker's answer
}

func (e *PermissionError) Error() string {
	var answer string
	if ke := (*kerr.Error)(nil); errors.As(e.Err, &ke) {
		answer = " (the broker answered " + ke.Message + ")"
	}
	if e.ACL.Name == "" {
		return "missing ACL on one of the instance's topics; the broker did not say which, see the least-privilege set in docs/security.md" + answer
	}
	return "missing ACL: " + e.ACL.String() + answer
}

func (e *PermissionError) Unwrap() error { return e.Err }

// refusal classifies err without asking the brokers: the *PermissionError
// or *AuthError it is or amounts to, or nil. A refused topic operation
// needs the topic, which errors do not carry; topicRefused says so and the
// caller names it.
func (in *Instance) refusal(err error) (final error, topicRefused bool) {
	if err == nil {
		return nil, false
	}
	if refused := in.sasl.err(); refused != nil {
		return refused, false
	}
	var (
		pe *PermissionError
		ae *AuthError
	)
	switch {
	case errors.As(err, &pe):
		return pe, false
	case errors.As(err, &ae):
		return ae, false
	case authFailure(err):
		return &AuthError{Err: err}, false
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return &PermissionError{ACL: in.needed(kmsg.ACLResourceTypeTransactionalId, in.cfg.transactionalID(), kmsg.ACLOperationWrite), Err: err}, false
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		return &PermissionError{ACL: in.needed(kmsg.ACLResourceTypeGroup, in.cfg.AppID, kmsg.ACLOperationRead), Err: err}, false
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		// The one cluster operation on the data path: an idempotent
		// producer on a broker older than Kafka 2.8.
		return &PermissionError{ACL: ACL{Resource: kmsg.ACLResourceTypeCluster, Name: clusterName, Operation: kmsg.ACLOperationIdempotentWrite,
			Why: "produce idempotently (brokers older than Kafka 2.8)"}, Err: err}, false
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return nil, true
	}
	return nil, false
}

// needed is the ACL of Options.ACLs for the resource and operation, with its
// reason, or a bare one if the list does not have it.
func (in *Instance) needed(rt kmsg.ACLResourceType, name string, op kmsg.ACLOperation) ACL {
	for _, a := range in.cfg.ACLs() {
		if a.Resource == rt && a.Name == name && a.Operation == op {
			return a
		}
	}
	return ACL{Resource: rt, Name: name, Operation: op}
}

// denied returns the final error err amounts to (a *PermissionError or an
// *AuthError), or nil if err is not about permissions. A refused topic
// operation is named by asking the brokers which needed operations they
// allow (checkAccess).
func (in *Instance) denied(ctx context.Context, err error) error {
	final, topicRefused := in.refusal(err)
	if final != nil || !topicRefused {
		return final
	}
	if found := in.diagnose(ctx); found != nil {
		return found
	}
	return &PermissionError{ACL: ACL{Resource: kmsg.ACLResourceTypeTopic}, Err: err}
}

// deniedTopic is denied for the error of a request on topic that needed
// op, where the caller knows both (a fetch: READ).
func (in *Instance) deniedTopic(err error, topic string, op kmsg.ACLOperation) error {
	if final, topicRefused := in.refusal(err); !topicRefused {
		return final
	}
	return &PermissionError{ACL: in.needed(kmsg.ACLResourceTypeTopic, topic, op), Err: err}
}

// startupDenied is the check at the end of every start-up attempt, whatever
// prepare returned (err): a missing ACL explains many failures (an input
// topic that seems absent, a refused create or describe) and is final;
// after a successful prepare it finds what the first epoch or the first
// restore would (a changelog the instance cannot read back, an output it
// cannot write). It returns nil when it finds nothing final.
func (in *Instance) startupDenied(ctx context.Context, err error) error {
	final, topicRefused := in.refusal(err)
	if final != nil || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		// A cluster too slow to answer prepare would keep the
		// diagnosis waiting too; the next attempt asks again.
		return final
	}
	if found := in.diagnose(ctx); found != nil {
		return found
	}
	if topicRefused {
		return &PermissionError{ACL: ACL{Resource: kmsg.ACLResourceTypeTopic}, Err: err}
	}
	return nil
}

// pollDenied returns the final error among a poll's errors (the group's:
// JoinGroup, SyncGroup, Heartbeat, OffsetFetch; or a fetch's), or refused
// credentials.
func (in *Instance) pollDenied(ctx context.Context, fs kgo.Fetches) error {
	if refused := in.sasl.err(); refused != nil {
		return refused // the session's requests are retried in silence
	}
	for _, fe := range fs.Errors() {
		if fe.Topic != "" {
			if err := in.deniedTopic(fe.Err, fe.Topic, kmsg.ACLOperationRead); err != nil {
				return err
			}
			continue
		}
		if err := in.denied(ctx, fe.Err); err != nil {
			return err
		}
	}
	return nil
}

// diagnose returns a *PermissionError or *AuthError for the first ACL of
// Options.ACLs the brokers do not grant, as far as they tell (checkAccess),
// or nil.
func (in *Instance) diagnose(ctx context.Context) error {
	// Its own bound: ctx may be a request's that has just run out.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := in.checkAccess(dctx)
	var pe *PermissionError
	if errors.As(err, &pe) {
		return pe
	}
	if authFailure(err) {
		return &AuthError{Err: err}
	}
	return nil
}

// checkAccess asks the brokers whether they grant every ACL of Options.ACLs,
// and returns a *PermissionError for the first one they do not, nil when
// they grant all they can tell about, or the error of a request that failed.
//
// Topics: a Metadata request with the topics' authorized operations
// (KIP-430). A topic the broker will not even describe lacks the first
// needed operation that implies DESCRIBE; a missing topic is created with
// validate-only, which checks CREATE and creates nothing. The group: a
// DescribeGroups with its authorized operations. The transactional id has
// no such question; InitProducerID answers it at the first record.
func (in *Instance) checkAccess(ctx context.Context) error {
	need := in.cfg.ACLs()
	var topics []string
	for _, a := range need {
		if a.Resource == kmsg.ACLResourceTypeTopic && !slices.Contains(topics, a.Name) {
			topics = append(topics, a.Name)
		}
	}
	meta := kmsg.NewPtrMetadataRequest()
	meta.IncludeTopicAuthorizedOperations = true
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		meta.Topics = append(meta.Topics, rt)
	}
	resp, err := meta.RequestWith(ctx, in.admCl)
	if err != nil {
		return err
	}
	answers := map[string]kmsg.MetadataResponseTopic{}
	for _, t := range resp.Topics {
		if t.Topic != nil {
			answers[*t.Topic] = t
		}
	}
	var absent []string
	for _, t := range topics {
		ans, ok := answers[t]
		switch code := kerr.ErrorForCode(ans.ErrorCode); {
		case !ok:
			continue
		case code == kerr.TopicAuthorizationFailed:
			return &PermissionError{ACL: describer(need, t), Err: code}
		case code == kerr.UnknownTopicOrPartition:
			absent = append(absent, t)
			continue
		case code != nil:
			continue
		}
		for _, a := range need {
			if a.Resource == kmsg.ACLResourceTypeTopic && a.Name == t && a.Operation != kmsg.ACLOperationCreate && !granted(ans.AuthorizedOperations, a.Operation) {
				return &PermissionError{ACL: a, Err: errNotAuthorized}
			}
		}
	}
	if err := in.checkCreate(ctx, need, absent); err != nil {
		return err
	}
	return in.checkGroup(ctx, need)
}

// errNotAuthorized stands for the broker's answer when it listed the
// operations it allows rather than refusing a request.
var errNotAuthorized = errors.New("not among the operations the broker allows this principal")

// granted reports whether a KIP-430 authorized-operations bit field allows
// op; a broker that did not compute the field (INT32_MIN) is given the
// benefit of the doubt.
func granted(ops int32, op kmsg.ACLOperation) bool {
	return ops == math.MinInt32 || ops&(1<<int32(op)) != 0
}

// describer is the ACL to name when topic cannot even be described: the
// first needed operation on it that implies DESCRIBE.
func describer(need []ACL, topic string) ACL {
	for _, a := range need {
		if a.Resource == kmsg.ACLResourceTypeTopic && a.Name == topic &&
			(a.Operation == kmsg.ACLOperationRead || a.Operation == kmsg.ACLOperationWrite) {
			return a
		}
	}
	return ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Operation: kmsg.ACLOperationDescribe}
}

// checkCreate checks CREATE on the absent topics that need it with a
// validate-only CreateTopics.
func (in *Instance) checkCreate(ctx context.Context, need []ACL, absent []string) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	req.ValidateOnly = true
	req.TimeoutMillis = 5000
	for _, a := range need {
		if a.Resource == kmsg.ACLResourceTypeTopic && a.Operation == kmsg.ACLOperationCreate && slices.Contains(absent, a.Name) {
			rt := kmsg.NewCreateTopicsRequestTopic()
			rt.Topic = a.Name
			rt.NumPartitions = -1
			rt.ReplicationFactor = -1
			req.Topics = append(req.Topics, rt)
		}
	}
	if len(req.Topics) == 0 {
		return nil
	}
	resp, err := req.RequestWith(ctx, in.admCl)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		if code := kerr.ErrorForCode(t.ErrorCode); code == kerr.TopicAuthorizationFailed {
			return &PermissionError{ACL: in.needed(kmsg.ACLResourceTypeTopic, t.Topic, kmsg.ACLOperationCreate), Err: code}
		}
	}
	return nil
}

// checkGroup checks READ on the group with a DescribeGroups.
func (in *Instance) checkGroup(ctx context.Context, need []ACL) error {
	i := slices.IndexFunc(need, func(a ACL) bool { return a.Resource == kmsg.ACLResourceTypeGroup })
	if i < 0 {
		return nil
	}
	a := need[i]
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{a.Name}
	req.IncludeAuthorizedOperations = true
	resp, err := req.RequestWith(ctx, in.admCl)
	if errors.Is(err, kerr.GroupAuthorizationFailed) { // from FindCoordinator
		return &PermissionError{ACL: a, Err: err}
	}
	if err != nil {
		return err
	}
	for _, g := range resp.Groups {
		code := kerr.ErrorForCode(g.ErrorCode)
		if code == kerr.GroupAuthorizationFailed {
			return &PermissionError{ACL: a, Err: code}
		}
		// A group that does not exist yet has no authorized operations
		// to tell (Kafka leaves them unset); JoinGroup will say.
		if code == nil && !granted(g.AuthorizedOperations, a.Operation) {
			return &PermissionError{ACL: a, Err: errNotAuthorized}
		}
	}
	return nil
}
