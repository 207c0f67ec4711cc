package engine

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group membership under both protocols: the options of a session's client,
// and how an instance leaves for good.
//
// Leaving differs: franz-go's Close of a static KIP-848 member sends epoch
// -2, which keeps the partitions reserved for a restart (kfake keeps them
// until the instance returns, Kafka until the session expires); leaving
// for good (LeaveOnShutdown) takes epoch -1, sent after that close. A
// classic LeaveGroup names the instance, and a KIP-848 group answers it
// with UNKNOWN_MEMBER_ID for the member, not as the request's error.

// Heartbeat epochs of KIP-848 with a meaning of their own.
const (
	epochLeave       int32 = -1 // leave the group; the partitions move at once
	epochStaticLeave int32 = -2 // static member away; its partitions wait for it (franz-go's Close)
)

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
		// DESIGN §10: with a rebalance timeout below the session timeout,
		// this keeps kfake's classic coordinator from stalling a group.
		kgo.RequestTimeoutOverhead(5 * time.Second),
		// Under KIP-848 the broker assigns; franz-go maps this balancer
		// to its "uniform" assignor, which is sticky too.
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
	}
	if in.cfg.GroupProtocol == "consumer" {
		opts = append(opts, kgo.ServerSideBalancer())
	}
	return opts
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

// leave removes this instance from the group for good after a graceful
// stop, if configured to, so its partitions move at once. It runs after
// the session's client is closed: a KIP-848 leave sent while that client
// still heartbeats would make it rejoin.
func (in *Instance) leave() {
	if !in.cfg.LeaveOnShutdown {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := errNotConsumerGroup
	if in.cfg.GroupProtocol == "consumer" {
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
