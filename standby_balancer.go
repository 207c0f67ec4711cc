package sluice

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/groupview"
)

// The group protocol of an app with standby replicas (classic protocol;
// Kafka Streams' StreamsPartitionAssignor does the same job for it). Each
// member's JoinGroup metadata carries the changelog offsets of the task
// copies it holds locally: its running tasks, its standbys and the state
// files it found at its start. The leader assigns tasks, not partitions (a
// task is partition p of every input topic):
//
//   - A task stays with the member that runs it, as the sticky balancers
//     keep partitions, within an even spread (no member more than one task
//     above another).
//   - A task without a running owner (its member left or crashed, or the
//     group is new) goes to the member whose copy of it is the most
//     recent, among those with room: that member restores only the tail
//     its copy lacks. A standby kept up to date is that member.
//   - Each task gets Options.StandbyReplicas standbys on members other
//     than its owner, spread evenly, preferring members that hold a copy;
//     with racks (Options.Rack, the JoinGroup metadata's rack), members in
//     racks the task has no copy in come first.
//   - Warm-ups (Options.MaxWarmupReplicas; Kafka Streams' KIP-441): a
//     task whose place in the spread is a member without a caught-up
//     copy (within Options.AcceptableRecoveryLag of the end, as the
//     member measured it, or of the group's freshest copy) stays on a
//     member whose copy is caught up, while one has it: the member
//     running it, or the least loaded. Its place gets a warm-up: a
//     standby that asks for a rebalance once it is caught up (standby.go),
//     after which this plan moves the task there. A standby the task
//     has there already is its warm-up; at most MaxWarmupReplicas others
//     are added at a time, and the tasks beyond wait for a later round.
//
// The standbys and warm-ups travel in each member's assignment user data. Under the
// cooperative protocol (one input topic) the plan is adjusted as franz-go's
// cooperative-sticky balancer adjusts its own: a task moving between
// members is first revoked by its owner, then assigned in the next round.
// Several input topics keep the eager protocol of the range balancer they
// use without standbys (balancer).

// standbyProtocol is its name; groupview has its user data's encodings.
const standbyProtocol = groupview.StandbyAssignor

type standbyBalancer struct {
	in          *Instance
	replicas    int
	warmups     warmups
	cooperative bool
}

func (in *Instance) standbyBalancer() *standbyBalancer {
	return &standbyBalancer{in: in, replicas: in.cfg.StandbyReplicas, cooperative: len(in.cfg.InputTopics) == 1,
		warmups: warmups{most: max(in.cfg.MaxWarmupReplicas, 0), lag: in.cfg.AcceptableRecoveryLag}}
}

func (*standbyBalancer) ProtocolName() string { return standbyProtocol }

func (b *standbyBalancer) IsCooperative() bool { return b.cooperative }

func (b *standbyBalancer) JoinGroupMetadata(interests []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.Generation = generation
	if rack := b.in.cfg.Rack; rack != "" {
		meta.Rack = &rack
	}
	for _, topic := range slices.Sorted(maps.Keys(current)) {
		owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
		owned.Topic, owned.Partitions = topic, current[topic]
		meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
	}
	meta.UserData = groupview.EncodeLocalCopies(b.in.standbys.localCopies())
	return meta.AppendTo(nil)
}

func (b *standbyBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	var a kmsg.ConsumerMemberAssignment
	if err := a.ReadFrom(assignment); err != nil {
		return nil, fmt.Errorf("sync assignment parse failed: %w", err)
	}
	sb, err := groupview.DecodeStandbys(a.UserData)
	if err != nil {
		return nil, err
	}
	m := make(map[string][]int32, len(a.Topics))
	for _, t := range a.Topics {
		m[t.Topic] = t.Partitions
	}
	b.in.standbys.fallback.Store(false)
	b.in.standbys.assigned(sb)
	return m, nil
}

func (b *standbyBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	return cb, cb.MemberTopics(), err
}

// Balance is the leader's: see the top of the file.
func (b *standbyBalancer) Balance(cb *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	var tasks int32
	for _, n := range topics {
		tasks = max(tasks, n)
	}
	// A claim to a task counts only at the highest generation claiming
	// it: a member that missed rebalances may still claim what another
	// has run since (KIP-792), as franz-go's sticky balancer reads them.
	newest := map[int32]int32{}
	cb.EachMember(func(_ *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		for _, o := range meta.OwnedPartitions {
			for _, t := range o.Partitions {
				if g, ok := newest[t]; !ok || meta.Generation > g {
					newest[t] = meta.Generation
				}
			}
		}
	})
	members := make([]taskMember, 0, len(cb.Members()))
	cb.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		tm := taskMember{}
		if meta.Rack != nil {
			tm.rack = *meta.Rack
		}
		for _, o := range meta.OwnedPartitions {
			for _, t := range o.Partitions {
				if meta.Generation >= newest[t] {
					tm.owned = append(tm.owned, t)
				}
			}
		}
		// A member whose copies cannot be read (another release's
		// encoding) is assigned as one without copies.
		copies, _ := groupview.DecodeLocalCopies(meta.UserData)
		tm.local, tm.lag = map[int32]int64{}, map[int32]int64{}
		for t, c := range copies {
			tm.local[t], tm.lag[t] = c.Offset, c.Lag
		}
		members = append(members, tm)
	})
	plan := assignTasks(tasks, members, b.replicas, b.warmups)
	runs := make([]int, tasks) // task → member
	for i, ts := range plan.active {
		for _, t := range ts {
			runs[t] = i
		}
	}
	// Partition t of each topic goes to task t's member; of a topic that
	// member does not read (members with other input topics, in a
	// rolling change of them), to the first member that does.
	p := cb.NewPlan()
	for topic, n := range topics {
		var readers []int
		for i := range members {
			if _, meta := cb.MemberAt(i); slices.Contains(meta.Topics, topic) {
				readers = append(readers, i)
			}
		}
		for t := range n {
			i := runs[t]
			if len(readers) > 0 && !slices.Contains(readers, i) {
				i = readers[0]
			}
			m, _ := cb.MemberAt(i)
			p.AddPartition(m, topic, t)
		}
	}
	var final map[string]map[string][]int32
	if b.cooperative {
		p.AdjustCooperative(cb)
		final = p.AsMemberIDMap()
	}
	standbys := map[string]groupview.Standbys{}
	for i := range members {
		m, meta := cb.MemberAt(i)
		sb := groupview.Standbys{Tasks: plan.standby[i], Warmup: plan.warmup[i], AcceptableLag: b.warmups.lag}
		if b.cooperative && b.warmups.most > 0 {
			// A task this plan moves here is withheld until its owner
			// revoked it: meanwhile the member keeps following it, so
			// that the next round finds its copy as caught up as it
			// is (a copy it stopped following would look behind the
			// owner's last commit, and the task would go back).
			for _, t := range plan.active[i] {
				reads := slices.ContainsFunc(meta.Topics, func(topic string) bool { return t < topics[topic] })
				got := slices.ContainsFunc(slices.Collect(maps.Values(final[m.MemberID])), func(ps []int32) bool { return slices.Contains(ps, t) })
				if reads && !got {
					sb.Incoming = append(sb.Incoming, t)
					if !slices.Contains(sb.Tasks, t) {
						sb.Tasks = append(slices.Clone(sb.Tasks), t)
						slices.Sort(sb.Tasks)
					}
				}
			}
		}
		standbys[m.MemberID] = sb
	}
	return &standbyAssignment{plan: p, standbys: standbys}
}

// withoutStandbys is the balancer the group falls back to when one of its
// members does not offer the standby balancer (an instance without
// standbys): an assignment from it ends this member's standbys, which
// would otherwise keep following tasks the group knows nothing of.
type withoutStandbys struct {
	kgo.GroupBalancer
	in *Instance
}

func (b withoutStandbys) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	b.in.standbys.assigned(groupview.Standbys{})
	if !b.in.standbys.fallback.Swap(true) {
		b.in.log.Warn("the group assigns with "+b.ProtocolName()+", not "+standbyProtocol+": a member does not set SLUICE_STANDBY_REPLICAS; no standby replicas until it leaves",
			"standby_replicas", b.in.cfg.StandbyReplicas)
	}
	return b.GroupBalancer.ParseSyncAssignment(assignment)
}

// standbyAssignment is a plan with each member's standbys, warm-ups and
// incoming tasks in its user data.
type standbyAssignment struct {
	plan     *kgo.BalancePlan
	standbys map[string]groupview.Standbys
}

func (a *standbyAssignment) IntoSyncAssignment() []kmsg.SyncGroupRequestGroupAssignment {
	out := a.plan.IntoSyncAssignment()
	for i := range out {
		var ma kmsg.ConsumerMemberAssignment
		if err := ma.ReadFrom(out[i].MemberAssignment); err != nil {
			panic(fmt.Sprintf("sluice: re-reading an assignment franz-go encoded: %v", err)) // cannot happen
		}
		ma.UserData = groupview.EncodeStandbys(a.standbys[out[i].MemberID])
		out[i].MemberAssignment = ma.AppendTo(nil)
	}
	return out
}

// taskMember is what the leader knows of a member: the tasks it runs (a
// partition of any input counts), the changelog offsets of its copies, and
// their lags as it measured them (-1 or none: not measured).
type taskMember struct {
	owned      []int32
	local, lag map[int32]int64
	rack       string // Options.Rack, "" unknown
}

// taskPlan is each member's tasks, standbys and warm-ups (a subset of its
// standbys), in the members' order, and for each task the member it waits
// to move to (-1: none).
type taskPlan struct {
	active, standby, warmup [][]int32
	waits                   []int
}

// warmups is the leader's policy of warm-up replicas: at most most added
// at a time (0: no warm-ups, tasks move at once), and the lag a caught-up
// copy may have.
type warmups struct {
	most int
	lag  int64
}

// assignTasks spreads tasks 0..tasks-1 over members (in the group's order,
// which franz-go sorts by instance id) with replicas standbys each, and
// warm-ups as warm says; see the top of the file.
func assignTasks(tasks int32, members []taskMember, replicas int, warm warmups) taskPlan {
	n := len(members)
	plan := taskPlan{active: make([][]int32, n), standby: make([][]int32, n), warmup: make([][]int32, n)}
	if n == 0 || tasks <= 0 {
		return plan
	}
	owner := make([]int, tasks)
	for t := range owner {
		owner[t] = -1
	}
	// An even spread: every member runs q tasks or q+1, and r of them q+1.
	q, r := int(tasks)/n, int(tasks)%n
	count, atHi := make([]int, n), 0
	canTake := func(i int) bool { return count[i] < q || (count[i] == q && atHi < r) }
	take := func(i int, t int32) {
		owner[t] = i
		count[i]++
		if count[i] == q+1 {
			atHi++
		}
	}
	copyOf := func(i int, t int32) int64 {
		if off, ok := members[i].local[t]; ok {
			return off
		}
		return -1
	}
	// A member above its share gives up first the tasks whose copy
	// elsewhere lags its own the least: those restore fastest there.
	// With warm-ups a lag within the acceptable one counts as none, so
	// that the choice does not follow the lags' every move from one
	// round to the next (a warm-up must find its task chosen again).
	behindElsewhere := func(i int, t int32) int64 {
		best := int64(-1)
		for j := range members {
			if j != i {
				best = max(best, copyOf(j, t))
			}
		}
		if best < 0 {
			return math.MaxInt64
		}
		if warm.most > 0 && copyOf(i, t)-best <= warm.lag {
			return 0
		}
		return copyOf(i, t) - best
	}
	owned := make([][]int32, n)
	claims := map[int32]int{}
	for i, m := range members {
		owned[i] = slices.DeleteFunc(slices.Clone(m.owned), func(t int32) bool { return t < 0 || t >= tasks })
		slices.Sort(owned[i])
		owned[i] = slices.Compact(owned[i])
		slices.SortStableFunc(owned[i], func(a, b int32) int { return cmp.Compare(behindElsewhere(i, b), behindElsewhere(i, a)) })
		for _, t := range owned[i] {
			claims[t]++
		}
	}
	// What one member alone claims first; a task two claim at the same
	// generation (a member that missed a revoke) goes to the first with
	// room afterwards.
	for _, contested := range []bool{false, true} {
		for i := range members {
			for _, t := range owned[i] {
				if (claims[t] > 1) == contested && owner[t] < 0 && canTake(i) {
					take(i, t)
				}
			}
		}
	}
	for t := range tasks {
		if owner[t] >= 0 {
			continue
		}
		best := -1
		for i := range members {
			if !canTake(i) {
				continue
			}
			if best < 0 || copyOf(i, t) > copyOf(best, t) || (copyOf(i, t) == copyOf(best, t) && count[i] < count[best]) {
				best = i
			}
		}
		take(best, t)
	}
	// The warm-ups: a task whose place has no caught-up copy stays on a
	// member whose copy is: the member running it, else the least loaded
	// one. Its place gets a warm-up (addWarmups).
	wants := make([]int, tasks) // task → the member it waits to move to, -1: none
	for t := range wants {
		wants[t] = -1
	}
	if warm.most > 0 {
		newest := make([]int64, tasks)
		for t := range tasks {
			newest[t] = -1
			for i := range members {
				newest[t] = max(newest[t], copyOf(i, t))
			}
		}
		caughtUp := func(i int, t int32) bool {
			if slices.Contains(owned[i], t) {
				return true // it runs there: it is what the changelog has
			}
			if lag, ok := members[i].lag[t]; ok && lag >= 0 && lag <= warm.lag {
				return true
			}
			// What a restore there would read, at most: the changelog
			// from the copy (or its start) to the freshest copy.
			return newest[t]-max(copyOf(i, t), 0) <= warm.lag
		}
		for t := range tasks {
			place := owner[t]
			if caughtUp(place, t) {
				continue
			}
			best := -1
			for i := range members {
				if i == place || !caughtUp(i, t) {
					continue
				}
				// The member running it keeps it (no move at
				// all); else the least loaded.
				runs, bestRuns := slices.Contains(owned[i], t), best >= 0 && slices.Contains(owned[best], t)
				if best < 0 || (runs && !bestRuns) || (runs == bestRuns && count[i] < count[best]) {
					best = i
				}
			}
			if best >= 0 {
				owner[t], wants[t] = best, place
				count[place]--
				count[best]++
			}
		}
	}
	for t := range tasks {
		plan.active[owner[t]] = append(plan.active[owner[t]], t)
	}
	plan.waits = wants

	replicas = min(replicas, n-1)
	if replicas <= 0 {
		plan.addWarmups(wants, warm.most)
		return plan
	}
	// First the members holding a copy, the most recent first, each up
	// to the even share; then the fewest standbys first. With racks
	// (Options.Rack), members away from the racks of the task's owner
	// and standbys so far come first, so that losing a rack leaves a
	// copy (Kafka Streams' rack-aware standbys).
	limit := (int(tasks)*replicas + n - 1) / n
	scount := make([]int, n)
	chosen := make([][]int, tasks)
	// awayness of member i for task t: 2, its rack is known and neither
	// the owner of t nor another of its standbys is in it; 1, its rack is
	// unknown; 0, the task has a copy in its rack. away is awayness ≥ 1.
	awayness := func(t int32, i int) int {
		r := members[i].rack
		switch {
		case r == "":
			return 1
		case members[owner[t]].rack == r || slices.ContainsFunc(chosen[t], func(j int) bool { return j != i && members[j].rack == r }):
			return 0
		}
		return 2
	}
	away := func(t int32, i int) bool { return awayness(t, i) > 0 }
	// anyAway: some member could still take t away from its racks; when
	// none can, racks no longer decide and copies count as without them.
	anyAway := func(t int32) bool {
		for i := range members {
			if i != owner[t] && !slices.Contains(chosen[t], i) && away(t, i) {
				return true
			}
		}
		return false
	}
	add := func(t int32, i int) {
		chosen[t] = append(chosen[t], i)
		scount[i]++
		plan.standby[i] = append(plan.standby[i], t)
	}
	for t := range tasks {
		var warm []int
		for i := range members {
			if i != owner[t] && copyOf(i, t) >= 0 {
				warm = append(warm, i)
			}
		}
		slices.SortStableFunc(warm, func(a, b int) int { return cmp.Compare(copyOf(b, t), copyOf(a, t)) })
		for _, i := range warm {
			if len(chosen[t]) < replicas && scount[i] < limit && (away(t, i) || !anyAway(t)) {
				add(t, i)
			}
		}
	}
	for t := range tasks {
		for len(chosen[t]) < replicas {
			best := -1
			for i := range members {
				if i == owner[t] || slices.Contains(chosen[t], i) {
					continue
				}
				if a := awayness(t, i); best < 0 || a > awayness(t, best) || (a == awayness(t, best) && scount[i] < scount[best]) {
					best = i
				}
			}
			add(t, best)
		}
	}
	// The fill can leave members two or more standbys apart where the
	// last tasks' only members with fewer ran them. Even them out along
	// chains: a member with more hands one standby to a member that may
	// hold it, which hands one of its own on, until one with at least
	// two fewer than the first takes it (an augmenting path, found
	// breadth first). Each chain lowers the sum of squares of the counts.
	even := func() bool {
		for hi := range members {
			prev, via := make([]int, n), make([]int32, n)
			for i := range prev {
				prev[i] = -2 // not reached
			}
			prev[hi] = -1
			// moving reports whether the chain to a moves task t
			// already: its racks are then no longer what chosen says.
			moving := func(a int, t int32) bool {
				for x := a; prev[x] >= 0; x = prev[x] {
					if via[x] == t {
						return true
					}
				}
				return false
			}
			for queue := []int{hi}; len(queue) > 0; queue = queue[1:] {
				a := queue[0]
				for _, t := range plan.standby[a] {
					for b := range members {
						// A move keeps the copy in its rack, or
						// takes it away from the task's others.
						if prev[b] != -2 || owner[t] == b || slices.Contains(chosen[t], b) ||
							(members[b].rack != members[a].rack && (!away(t, b) || moving(a, t))) {
							continue
						}
						prev[b], via[b] = a, t
						if scount[hi]-scount[b] <= 1 {
							queue = append(queue, b)
							continue
						}
						for x := b; prev[x] >= 0; x = prev[x] {
							from, t := prev[x], via[x]
							plan.standby[from] = slices.DeleteFunc(plan.standby[from], func(u int32) bool { return u == t })
							plan.standby[x] = append(plan.standby[x], t)
							chosen[t][slices.Index(chosen[t], from)] = x
						}
						scount[hi]--
						scount[b]++
						return true
					}
				}
			}
		}
		return false
	}
	for even() {
	}
	for i := range plan.standby {
		slices.Sort(plan.standby[i])
	}
	plan.addWarmups(wants, warm.most)
	return plan
}

// addWarmups gives each task waiting to move (wants: task → its place,
// -1: none) a warm-up at its place: the standby it has there, or one added
// while fewer than most were.
func (plan *taskPlan) addWarmups(wants []int, most int) {
	added := 0
	for t, place := range wants {
		switch {
		case place < 0:
			continue
		case slices.Contains(plan.standby[place], int32(t)):
		case added < most:
			added++
			plan.standby[place] = append(plan.standby[place], int32(t))
			slices.Sort(plan.standby[place])
		default:
			continue
		}
		plan.warmup[place] = append(plan.warmup[place], int32(t))
	}
}
