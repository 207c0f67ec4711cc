package sluice

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group membership under both protocols: the options of a session's client,
// what the consumer protocol (KIP-848) needs from the broker before the
// first join, and how an instance leaves for good.
//
// The two protocols differ where exactly-once cares least and operations
// care most:
//
//   - Session timeout. Classic members send theirs in JoinGroup. A KIP-848
//     member sends none: the group's consumer.session.timeout.ms (broker
//     default group.consumer.session.timeout.ms, 45s) decides. prepareGroup
//     sets that group config to SessionTimeout, so SLUICE_SESSION_TIMEOUT
//     means the same thing under both.
//   - A static member that crashed. A classic JoinGroup with a known
//     instance id replaces the old member at once. KIP-848 refuses the new
//     member (UNRELEASED_INSTANCE_ID) until the old one's session expires.
//     prepareGroup therefore ends the dead predecessor's membership with a
//     static leave (epoch -2) on its behalf, which is what a classic join
//     does implicitly; the new member then inherits its assignment.
//   - Leaving. franz-go's Close of a static KIP-848 member sends epoch -2,
//     which keeps the partitions reserved for a restart; leaving for good
//     (unless StayInGroupOnShutdown) takes epoch -1, sent after that close.

// Heartbeat epochs of KIP-848 with a meaning of their own.
const (
	epochLeave       int32 = -1 // leave the group; the partitions move at once
	epochStaticLeave int32 = -2 // static member away; its partitions wait for it
)

// kafkaHeartbeatInterval is Kafka's default and least
// group.consumer.heartbeat.interval.ms.
const kafkaHeartbeatInterval = 5 * time.Second

// balancer assigns the group's partitions. A task owns partition p of every
// input topic, so an instance reading several (co-partitioned) topics needs
// partition p of each on the same member: the range assignor gives that,
// client side (classic) and server side (KIP-848 "range"), for topics of
// equal partition counts, which prepare checks. It is eager under the
// classic protocol (every rebalance revokes everything, and the tasks
// restore from their local state), so a single input keeps the cooperative
// sticky one.
func (in *Instance) balancer() kgo.GroupBalancer {
	if len(in.cfg.InputTopics) > 1 {
		return kgo.RangeBalancer()
	}
	return kgo.CooperativeStickyBalancer()
}

// groupOpts are the consumer-group options of a session's client.
func (in *Instance) groupOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.ConsumerGroup(in.cfg.AppID),
		kgo.InstanceID(in.cfg.InstanceID),
		kgo.SessionTimeout(in.cfg.SessionTimeout),
		// franz-go refuses a heartbeat interval above the session timeout.
		// A KIP-848 member heartbeats at the interval the broker answers.
		kgo.HeartbeatInterval(min(3*time.Second, in.cfg.SessionTimeout/3)),
		kgo.RebalanceTimeout(in.cfg.RebalanceTimeout),
		// With a rebalance timeout below the session timeout (docs/architecture.md),
		// this keeps kfake's classic coordinator from stalling a group.
		kgo.RequestTimeoutOverhead(5 * time.Second),
		// Under KIP-848 the broker assigns; franz-go maps this balancer
		// to its "uniform" assignor, which is sticky too.
		kgo.Balancers(in.balancer()),
	}
	if in.standbys != nil {
		// Preferred by every member that has standbys; the group keeps
		// the other while a member without them is in it (a rolling
		// start), and then has no standbys.
		opts = append(opts, kgo.Balancers(in.standbyBalancer(), withoutStandbys{in.balancer(), in}))
	}
	if in.cfg.GroupProtocol == "consumer" {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	return opts
}

// inGroup reports whether cl is a member of the group. A classic member
// has a generation once it joined; a KIP-848 member starts at epoch 0,
// which means "joining", and is in the group from epoch 1.
func (in *Instance) inGroup(cl *kgo.Client) bool {
	_, gen := cl.GroupMetadata()
	if in.cfg.GroupProtocol == "consumer" {
		return gen > 0
	}
	return gen >= 0
}

// prepareGroup readies the group for a KIP-848 member before it joins: the
// group's session timeout, and the end of a crashed predecessor's
// membership. Neither is needed for correctness, only for the group to
// move on at the pace SessionTimeout promises, so failures are logged and
// the instance starts anyway; a context error is returned.
func (in *Instance) prepareGroup(ctx context.Context) error {
	if in.cfg.GroupProtocol != "consumer" {
		return nil
	}
	switch ok, err := in.brokersSpeakKIP848(ctx); {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		in.log.Warn("cannot read the brokers' API versions; assuming they offer KIP-848", "err", err)
	case !ok:
		in.log.Warn("the consumer group protocol is asked for, but the brokers do not offer KIP-848 (ConsumerGroupHeartbeat v1): the group runs the classic protocol")
		return nil
	}
	in.kip848 = true
	if err := in.setGroupSessionTimeout(ctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		in.log.Warn("cannot set the group's consumer.session.timeout.ms; the broker's applies (group.consumer.session.timeout.ms, 45s by default)",
			"want", in.cfg.SessionTimeout.String(), "err", err)
	}
	if err := in.replaceCrashedPredecessor(ctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		in.log.Warn("cannot end the previous membership of this instance id; joining waits until its session expires", "err", err)
	}
	return nil
}

// brokersSpeakKIP848 reports whether franz-go will run the consumer
// protocol: only when the brokers offer ConsumerGroupHeartbeat v1 (Kafka
// 4.0); otherwise it falls back to classic by itself.
func (in *Instance) brokersSpeakKIP848(ctx context.Context) (bool, error) {
	vs, err := in.adm.ApiVersions(ctx)
	if err != nil {
		return false, err
	}
	for _, v := range vs {
		if max, ok := v.KeyMaxVersion(int16(kmsg.ConsumerGroupHeartbeat)); v.Err == nil && ok && max >= 1 {
			return true, nil
		}
	}
	return false, nil
}

// setGroupSessionTimeout makes the group's consumer.session.timeout.ms
// SessionTimeout. A heartbeat interval is set with it only when Kafka's
// default (5s, also its least) would not fit three times into the session,
// so a broker with default limits is not asked for a value it refuses.
func (in *Instance) setGroupSessionTimeout(ctx context.Context) error {
	ms := func(d time.Duration) *string { return kmsg.StringPtr(strconv.FormatInt(d.Milliseconds(), 10)) }
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = in.cfg.AppID
	set := func(name string, v *string) {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = name, kmsg.IncrementalAlterConfigOpSet, v
		res.Configs = append(res.Configs, c)
	}
	set("consumer.session.timeout.ms", ms(in.cfg.SessionTimeout))
	if hb := in.cfg.SessionTimeout / 3; hb < kafkaHeartbeatInterval {
		set("consumer.heartbeat.interval.ms", ms(hb))
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, in.admCl)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			if r.ErrorMessage != nil {
				return fmt.Errorf("%w: %s", err, *r.ErrorMessage)
			}
			return err
		}
	}
	return nil
}

// errNotConsumerGroup says the group does not run the consumer protocol:
// it is classic (the broker has no KIP-848, so franz-go fell back) or
// does not exist.
var errNotConsumerGroup = errors.New("not a KIP-848 consumer group")

// staticMember finds this instance's member of the KIP-848 group; nil
// when it has none.
func (in *Instance) staticMember(ctx context.Context) (*kadm.ConsumerGroupMember, error) {
	described, err := in.adm.DescribeConsumerGroups(ctx, in.cfg.AppID)
	if err != nil {
		return nil, err
	}
	g, ok := described[in.cfg.AppID]
	switch {
	case !ok, errors.Is(g.Err, kerr.GroupIDNotFound):
		return nil, errNotConsumerGroup
	case g.Err != nil:
		return nil, g.Err
	}
	for _, m := range g.Members {
		if m.InstanceID != nil && *m.InstanceID == in.cfg.InstanceID {
			return &m, nil
		}
	}
	return nil, nil
}

// replaceCrashedPredecessor ends the membership of an earlier run of this
// instance that is still in the group: one killed before it could leave
// (a graceful stop leaves, or sends the static leave itself). Instance ids
// are unique per replica, so that member is this instance's past; if it
// still runs somewhere, the restart has already fenced its producer (same
// transactional id), and its group epoch goes stale, as with a classic
// static member replaced by a new join.
func (in *Instance) replaceCrashedPredecessor(ctx context.Context) error {
	m, err := in.staticMember(ctx)
	if errors.Is(err, errNotConsumerGroup) {
		return nil // a new group; or classic, where a join replaces the member itself
	}
	if err != nil || m == nil || m.MemberEpoch == epochStaticLeave {
		return err
	}
	if err := in.heartbeatAs(ctx, m.MemberID, epochStaticLeave); err != nil {
		return err
	}
	in.log.Info("took over this instance id's membership from a previous run that did not leave", "member", m.MemberID, "member_epoch", m.MemberEpoch)
	return nil
}

// leave removes this instance from the group for good after a graceful
// stop, if configured to (always after a stop request: stopped), so its
// partitions move at once. It runs after
// the session's client is closed: a KIP-848 leave sent while that client
// still heartbeats would make it rejoin.
func (in *Instance) leave(stopped bool) {
	if in.cfg.StayInGroupOnShutdown && !stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := errNotConsumerGroup
	if in.kip848 {
		err = in.leaveConsumerGroup(ctx)
	}
	if errors.Is(err, errNotConsumerGroup) {
		err = in.leaveClassicGroup(ctx)
	}
	if err != nil {
		in.log.Warn("leaving the group failed; partitions move when the session times out", "err", err)
		return
	}
	in.log.Info("left the group")
}

// leaveConsumerGroup sends the KIP-848 leave (epoch -1) for this instance's
// member, whether the closed client left it active or at -2.
func (in *Instance) leaveConsumerGroup(ctx context.Context) error {
	m, err := in.staticMember(ctx)
	if err != nil || m == nil {
		return err // nil: not a member (never joined, or expired)
	}
	return in.heartbeatAs(ctx, m.MemberID, epochLeave)
}

// heartbeatAs sends a KIP-848 leave heartbeat (epoch -1 or -2) for this
// instance's member. An unknown member is out already, which is the goal.
func (in *Instance) heartbeatAs(ctx context.Context, memberID string, epoch int32) error {
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Group = in.cfg.AppID
	req.MemberID = memberID
	req.InstanceID = kmsg.StringPtr(in.cfg.InstanceID)
	req.MemberEpoch = epoch
	resp, err := req.RequestWith(ctx, in.admCl)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		return err
	}
	return nil
}

// leaveClassicGroup removes this static member with LeaveGroup (KIP-345).
// The answer is per member: a failed leave shows there, not as the
// request's error. An unknown member is out already.
func (in *Instance) leaveClassicGroup(ctx context.Context) error {
	resp, err := in.adm.LeaveGroup(ctx, kadm.LeaveGroup(in.cfg.AppID).InstanceIDs(in.cfg.InstanceID).Reason("sluice instance shut down"))
	if err != nil {
		return err
	}
	if err := resp.Error(); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
		return err
	}
	return nil
}
