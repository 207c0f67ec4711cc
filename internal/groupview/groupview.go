// Package groupview describes an app's consumer group under either group
// protocol, classic or consumer (KIP-848): its state, and each member's
// static instance id and assigned partitions. processor inspect and reset
// show it; sluice.Instance.QueryOwner finds a task's owner in it.
package groupview

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group is a consumer group as its brokers describe it. State is Kafka's (Stable, Empty,
// PreparingRebalance, …); "Dead" means there is no such group.
type Group struct {
	State    string `json:"state"`
	Protocol string `json:"protocol"` // classic or consumer (KIP-848)
	// Assignor is the classic group's chosen assignor: cooperative-sticky,
	// range, or StandbyAssignor.
	Assignor string   `json:"assignor,omitempty"`
	Members  []Member `json:"members"`
}

// Member is one member of a Group: its assignment by topic, and under
// StandbyAssignor the tasks it keeps standby replicas of, and which of
// them are warm-up replicas (tasks the member is to run once its copy
// has caught up).
type Member struct {
	MemberID   string             `json:"member_id"`
	InstanceID string             `json:"instance_id"`
	ClientID   string             `json:"client_id"`
	Host       string             `json:"host"`
	Assigned   map[string][]int32 `json:"assigned"`
	Standby    []int32            `json:"standby,omitempty"`
	Warmup     []int32            `json:"warmup,omitempty"`
	// Rack is the rack the member said it is in (sluice.Options.Rack,
	// Kafka's client.rack), in a classic group.
	Rack string `json:"rack,omitempty"`
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
	v.State, v.Assignor = d.State, d.Protocol
	for _, m := range d.Members {
		mv := Member{MemberID: m.MemberID, InstanceID: deref(m.InstanceID), ClientID: m.ClientID, Host: m.ClientHost, Assigned: map[string][]int32{}}
		if meta, ok := m.Join.AsConsumer(); ok {
			mv.Rack = deref(meta.Rack)
		}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				mv.Assigned[t.Topic] = slices.Sorted(slices.Values(t.Partitions))
			}
			if d.Protocol == StandbyAssignor {
				// Unreadable (another release's): shown as none.
				sb, _ := DecodeStandbys(a.UserData)
				mv.Standby, mv.Warmup = sb.Tasks, sb.Warmup
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

// StandbyAssignor is the classic-protocol assignor of an app with standby
// replicas (sluice.Options.StandbyReplicas). Its members' JoinGroup user
// data carries each task copy they hold (EncodeLocalCopies); each member's
// assignment user data, the tasks it keeps standby replicas of and which
// of them are warm-ups (EncodeStandbys). An encoding that members of an
// earlier release cannot read needs a new assignor name: a member fails a
// sync it cannot read.
const StandbyAssignor = "sluice-standby-v1"

// The versions heading the two user data encodings.
const (
	localCopiesVersion byte = 2
	standbyVersion     byte = 2
)

// ErrUserData is returned (wrapped) for user data that does not decode.
var ErrUserData = errors.New("unreadable group user data")

// Copy is a member's copy of a task's state: the changelog offset it is
// complete to, and how many offsets it was behind the changelog's end when
// the member last looked (0 for a task it runs, -1 when it has not looked:
// a file it found at its start).
type Copy struct {
	Offset, Lag int64
}

// EncodeLocalCopies writes version, count, then (task int32, changelog
// offset int64, lag int64) in task order.
func EncodeLocalCopies(m map[int32]Copy) []byte {
	b := binary.BigEndian.AppendUint32([]byte{localCopiesVersion}, uint32(len(m)))
	for _, t := range slices.Sorted(maps.Keys(m)) {
		b = binary.BigEndian.AppendUint32(b, uint32(t))
		b = binary.BigEndian.AppendUint64(b, uint64(m[t].Offset))
		b = binary.BigEndian.AppendUint64(b, uint64(m[t].Lag))
	}
	return b
}

// DecodeLocalCopies reads EncodeLocalCopies.
func DecodeLocalCopies(b []byte) (map[int32]Copy, error) {
	if len(b) < 5 || b[0] != localCopiesVersion {
		return nil, fmt.Errorf("%w: local copies of %d bytes", ErrUserData, len(b))
	}
	n := binary.BigEndian.Uint32(b[1:])
	b = b[5:]
	if uint64(len(b)) != uint64(n)*20 {
		return nil, fmt.Errorf("%w: %d local copies in %d bytes", ErrUserData, n, len(b))
	}
	m := make(map[int32]Copy, n)
	for ; len(b) > 0; b = b[20:] {
		m[int32(binary.BigEndian.Uint32(b))] = Copy{Offset: int64(binary.BigEndian.Uint64(b[4:])), Lag: int64(binary.BigEndian.Uint64(b[12:]))}
	}
	return m, nil
}

// Standbys is a member's part of a StandbyAssignor assignment besides its
// partitions.
type Standbys struct {
	// Tasks are the tasks it keeps standby replicas of.
	Tasks []int32
	// Warmup are those of Tasks it is to run once its copy has caught up.
	Warmup []int32
	// Incoming are those of Tasks assigned to it but withheld until their
	// owner has revoked them (the cooperative protocol's two rounds): it
	// keeps following them meanwhile.
	Incoming []int32
	// AcceptableLag is the leader's acceptable recovery lag: how close to
	// its changelog's end a warm-up's copy must be to ask for its task.
	AcceptableLag int64
}

// EncodeStandbys writes version, the three task lists (each a count and
// its tasks), then the acceptable lag.
func EncodeStandbys(sb Standbys) []byte {
	b := []byte{standbyVersion}
	for _, ts := range [][]int32{sb.Tasks, sb.Warmup, sb.Incoming} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(ts)))
		for _, t := range ts {
			b = binary.BigEndian.AppendUint32(b, uint32(t))
		}
	}
	return binary.BigEndian.AppendUint64(b, uint64(sb.AcceptableLag))
}

// DecodeStandbys reads EncodeStandbys.
func DecodeStandbys(b []byte) (Standbys, error) {
	if len(b) < 1 || b[0] != standbyVersion {
		return Standbys{}, fmt.Errorf("%w: a standby assignment of %d bytes", ErrUserData, len(b))
	}
	b = b[1:]
	var lists [3][]int32
	for i := range lists {
		if len(b) < 4 {
			return Standbys{}, fmt.Errorf("%w: a standby assignment cut short", ErrUserData)
		}
		n := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(len(b)) < uint64(n)*4 {
			return Standbys{}, fmt.Errorf("%w: a standby assignment of %d tasks in %d bytes", ErrUserData, n, len(b))
		}
		lists[i] = make([]int32, 0, n)
		for range n {
			lists[i] = append(lists[i], int32(binary.BigEndian.Uint32(b)))
			b = b[4:]
		}
	}
	if len(b) != 8 {
		return Standbys{}, fmt.Errorf("%w: a standby assignment ending in %d bytes, not 8", ErrUserData, len(b))
	}
	return Standbys{Tasks: lists[0], Warmup: lists[1], Incoming: lists[2], AcceptableLag: int64(binary.BigEndian.Uint64(b))}, nil
}
