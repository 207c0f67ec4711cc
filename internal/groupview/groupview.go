// Package groupview describes an app's consumer group under either group
// protocol, classic or consumer (KIP-848): its state, and each member's
// static instance id and assigned partitions. processor inspect and reset
// show it; sluice.Instance.QueryOwner finds a task's owner in it.
package groupview

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group is a consumer group as its brokers describe it. State is Kafka's (Stable, Empty,
// PreparingRebalance, …); "Dead" means there is no such group.
type Group struct {
	State    string   `json:"state"`
	Protocol string   `json:"protocol"` // classic or consumer (KIP-848)
	Members  []Member `json:"members"`
}

// Member is one member of a Group: its assignment by topic.
type Member struct {
	MemberID   string             `json:"member_id"`
	InstanceID string             `json:"instance_id"`
	ClientID   string             `json:"client_id"`
	Host       string             `json:"host"`
	Assigned   map[string][]int32 `json:"assigned"`
}

// Describe describes the group under either protocol: a KIP-848
// group is described by ConsumerGroupDescribe, a classic one by
// DescribeGroups.
func Describe(ctx context.Context, cl *kgo.Client, adm *kadm.Client, group string) (Group, error) {
	if v, ok, err := describeConsumerGroup(ctx, cl, adm, group); ok || err != nil {
		return v, err
	}
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return Group{}, fmt.Errorf("describe group %s: %w", group, err)
	}
	v := Group{State: "Dead", Protocol: "classic", Members: []Member{}}
	d, ok := gs[group]
	if !ok || errors.Is(d.Err, kerr.GroupIDNotFound) {
		return v, nil
	}
	if d.Err != nil {
		return Group{}, fmt.Errorf("describe group %s: %w", group, d.Err)
	}
	v.State = d.State
	for _, m := range d.Members {
		mv := Member{MemberID: m.MemberID, InstanceID: deref(m.InstanceID), ClientID: m.ClientID, Host: m.ClientHost, Assigned: map[string][]int32{}}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				mv.Assigned[t.Topic] = slices.Sorted(slices.Values(t.Partitions))
			}
		}
		v.Members = append(v.Members, mv)
	}
	return v, nil
}

// describeConsumerGroup describes a KIP-848 group; ok is false when the
// group is not one (a classic group, none, or a broker without KIP-848).
// It asks with the raw request rather than kadm's, which keeps only topic
// names, and a broker may send IDs alone.
func describeConsumerGroup(ctx context.Context, cl *kgo.Client, adm *kadm.Client, group string) (Group, bool, error) {
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Groups) != 1 {
		return Group{}, false, nil
	}
	g := resp.Groups[0]
	if g.ErrorCode != 0 || g.State == "" || g.State == "Dead" {
		return Group{}, false, nil
	}
	var names map[kadm.TopicID]string
	name := func(tp kmsg.AssignmentTopicPartition) (string, error) {
		if tp.Topic != "" {
			return tp.Topic, nil
		}
		if names == nil {
			md, err := adm.Metadata(ctx)
			if err != nil {
				return "", fmt.Errorf("describe group %s: topic names: %w", group, err)
			}
			names = map[kadm.TopicID]string{}
			for t, d := range md.Topics {
				names[d.ID] = t
			}
		}
		return names[tp.TopicID], nil
	}
	v := Group{State: g.State, Protocol: "consumer", Members: []Member{}}
	for _, m := range g.Members {
		mv := Member{MemberID: m.MemberID, InstanceID: deref(m.InstanceID), ClientID: m.ClientID, Host: m.ClientHost, Assigned: map[string][]int32{}}
		for _, tp := range m.Assignment.TopicPartitions {
			t, err := name(tp)
			if err != nil {
				return Group{}, true, err
			}
			mv.Assigned[t] = slices.Sorted(slices.Values(tp.Partitions))
		}
		v.Members = append(v.Members, mv)
	}
	return v, true, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
