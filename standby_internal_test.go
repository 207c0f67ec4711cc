package sluice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/groupview"
	"github.com/sluicehq/sluice/kstate"
)

// A group where nobody left keeps its tasks where they run; each task gets
// its standbys on other members, spread evenly.
func TestAssignTasksKeepsOwnersAndSpreadsStandbys(t *testing.T) {
	members := []taskMember{{owned: []int32{0, 3}}, {owned: []int32{1, 4}}, {owned: []int32{2, 5}}}
	plan := assignTasks(6, members, 1, warmups{})
	if want := [][]int32{{0, 3}, {1, 4}, {2, 5}}; !reflect.DeepEqual(plan.active, want) {
		t.Fatalf("active %v, want %v", plan.active, want)
	}
	checkPlan(t, 6, members, 1, plan)
	for i, s := range plan.standby {
		if len(s) != 2 {
			t.Fatalf("member %d stands by for %v, want 2 tasks", i, s)
		}
	}
}

// The tasks of a member that left go to the members holding their most
// recent copies, as far as the even spread allows.
func TestAssignTasksGivesFreedTasksToTheFreshestCopy(t *testing.T) {
	members := []taskMember{
		{owned: []int32{0, 1}, local: map[int32]int64{0: 500, 1: 400, 4: 90, 5: 30}},
		{owned: []int32{2, 3}, local: map[int32]int64{2: 500, 3: 400, 4: 80, 5: 70}},
	}
	plan := assignTasks(6, members, 1, warmups{})
	if want := [][]int32{{0, 1, 4}, {2, 3, 5}}; !reflect.DeepEqual(plan.active, want) {
		t.Fatalf("active %v, want %v (task 4 to member 0's copy at 90, 5 to member 1's at 70)", plan.active, want)
	}
	checkPlan(t, 6, members, 1, plan)

	// The freshest copy's member is full: the next freshest takes it.
	members[0].local[5] = 100
	plan = assignTasks(6, members, 1, warmups{})
	if want := [][]int32{{0, 1, 4}, {2, 3, 5}}; !reflect.DeepEqual(plan.active, want) {
		t.Fatalf("active %v, want %v (member 0 is full after task 4)", plan.active, want)
	}
}

// A member that joins takes its share from the others: each gives up the
// tasks whose copy elsewhere is nearest its own, here the ones the new
// member holds.
func TestAssignTasksMovesTasksWithCopiesToAJoiningMember(t *testing.T) {
	members := []taskMember{
		{owned: []int32{0, 1, 2}, local: map[int32]int64{0: 100, 1: 100, 2: 100}},
		{owned: []int32{3, 4, 5}, local: map[int32]int64{3: 100, 4: 100, 5: 100}},
		{local: map[int32]int64{1: 99, 4: 98}},
	}
	plan := assignTasks(6, members, 0, warmups{})
	if want := [][]int32{{0, 2}, {3, 5}, {1, 4}}; !reflect.DeepEqual(plan.active, want) {
		t.Fatalf("active %v, want %v", plan.active, want)
	}
	checkPlan(t, 6, members, 0, plan)
}

// Standbys go first to members holding a copy, within the even spread.
func TestAssignTasksPrefersStandbysWithCopies(t *testing.T) {
	members := []taskMember{
		{owned: []int32{0}},
		{owned: []int32{1}, local: map[int32]int64{0: 10}},
		{owned: []int32{2}, local: map[int32]int64{0: 20, 1: 5}},
	}
	plan := assignTasks(3, members, 1, warmups{})
	// Task 0's standby is member 2 (its copy at 20, above member 1's at
	// 10), which is then at its even share (1): task 1's goes to member 0
	// though member 2 holds a copy, and task 2's to member 1.
	if want := [][]int32{{1}, {2}, {0}}; !reflect.DeepEqual(plan.standby, want) {
		t.Fatalf("standby %v, want %v", plan.standby, want)
	}
	checkPlan(t, 3, members, 1, plan)
}

// More standbys than other members: as many as there are; one member:
// none.
func TestAssignTasksBoundsStandbysByMembers(t *testing.T) {
	members := []taskMember{{}, {}}
	plan := assignTasks(4, members, 3, warmups{})
	checkPlan(t, 4, members, 1, plan)
	plan = assignTasks(4, members[:1], 2, warmups{})
	if !reflect.DeepEqual(plan.active, [][]int32{{0, 1, 2, 3}}) || len(plan.standby[0]) != 0 {
		t.Fatalf("one member: %+v", plan)
	}
	if plan := assignTasks(0, members, 1, warmups{}); len(plan.active[0])+len(plan.active[1]) != 0 {
		t.Fatalf("no tasks: %+v", plan)
	}
}

// Standbys even out where the fill left a member without any and the
// fullest member's standbys are all tasks of the emptiest (found by
// review: the repair tried only that pair).
func TestAssignTasksEvensStandbysOut(t *testing.T) {
	members := []taskMember{{owned: []int32{0, 1, 2}}, {}, {owned: []int32{3}}, {owned: []int32{4, 5}, local: map[int32]int64{1: 13}}}
	plan := assignTasks(6, members, 2, warmups{})
	checkPlan(t, 6, members, 2, plan)
}

// Random groups: every task has one owner, owners are spread evenly, a
// member keeps what only it claims within its share, and standbys are
// distinct members other than the owner, spread evenly.
func TestAssignTasksInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		n := 1 + r.IntN(10)
		tasks := int32(r.IntN(64))
		replicas := r.IntN(5)
		members := randomMembers(r, n, tasks)
		if r.IntN(10) == 0 && n > 1 && tasks > 0 { // a stale claim: two owners
			members[0].owned = append(members[0].owned, 0)
			members[1].owned = append(members[1].owned, 0)
		}
		plan := assignTasks(tasks, members, replicas, warmups{})
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			checkPlan(t, tasks, members, replicas, plan)
			// Sticky: a member keeps the tasks only it claims, up to
			// the even share.
			claims := map[int32]int{}
			for _, m := range members {
				for _, task := range m.owned {
					claims[task]++
				}
			}
			for i, m := range members {
				var own []int32
				for _, task := range m.owned {
					if claims[task] == 1 {
						own = append(own, task)
					}
				}
				if len(own) > int(tasks)/n {
					continue
				}
				for _, task := range own {
					if !slices.Contains(plan.active[i], task) {
						t.Fatalf("member %d lost task %d, which only it claimed, within its share: owned %v, plan %v", i, task, m.owned, plan.active)
					}
				}
			}
		})
	}
}

// With racks (Options.Rack), a task's standbys go first to members in
// racks other than its owner's and its other standbys', ahead of a fresher
// copy in the owner's rack and of the even spread.
func TestAssignTasksPlacesStandbysInOtherRacks(t *testing.T) {
	members := []taskMember{
		{owned: []int32{0, 1}, rack: "a"},
		{owned: []int32{2, 3}, rack: "a", local: map[int32]int64{0: 100, 1: 100}},
		{owned: []int32{4, 5}, rack: "b"},
		{owned: []int32{6, 7}, rack: "b"},
	}
	plan := assignTasks(8, members, 1, warmups{})
	checkRacks(t, 8, members, 1, plan)
	for _, task := range []int32{0, 1} {
		if slices.Contains(plan.standby[1], task) {
			t.Fatalf("member 1 (rack a) stands by for task %d of member 0 (rack a): %+v", task, plan.standby)
		}
	}
	// Without racks the copy decides, as before.
	for i := range members {
		members[i].rack = ""
	}
	plan = assignTasks(8, members, 1, warmups{})
	if !slices.Contains(plan.standby[1], 0) || !slices.Contains(plan.standby[1], 1) {
		t.Fatalf("without racks, member 1's copies of tasks 0 and 1 are not its standbys: %+v", plan.standby)
	}
	// Three racks and two standbys: each task's copies in three racks.
	members = []taskMember{{owned: []int32{0, 1}, rack: "a"}, {owned: []int32{2, 3}, rack: "a"}, {owned: []int32{4}, rack: "b"}, {owned: []int32{5}, rack: "c"}}
	plan = assignTasks(6, members, 2, warmups{})
	checkRacks(t, 6, members, 2, plan)
	for task := range int32(6) {
		racks := map[string]bool{}
		for i, ts := range plan.active {
			if slices.Contains(ts, task) {
				racks[members[i].rack] = true
			}
		}
		for i, ts := range plan.standby {
			if slices.Contains(ts, task) {
				racks[members[i].rack] = true
			}
		}
		if len(racks) != 3 {
			t.Fatalf("task %d's owner and standbys are in racks %v, want a, b and c: %+v", task, racks, plan)
		}
	}
}

// Random groups with racks: each task has its standbys, distinct and not
// its owner, and at least one outside its owner's rack whenever a member
// is. One rack for every member is the plan without racks (found by
// review: copies were passed over once no member was away).
func TestAssignTasksRackInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	racks := []string{"", "a", "b", "c"}
	for i := range 20000 {
		n := 1 + r.IntN(8)
		tasks := int32(r.IntN(32))
		replicas := r.IntN(4)
		members := randomMembers(r, n, tasks)
		for m := range members {
			members[m].rack = racks[r.IntN(1+r.IntN(len(racks)))]
		}
		warm := warmups{most: r.IntN(3), lag: int64(r.IntN(30))}
		plan := assignTasks(tasks, members, replicas, warm)
		same := slices.Clone(members)
		for m := range same {
			same[m].rack = "z"
		}
		one := assignTasks(tasks, same, replicas, warm)
		for m := range same {
			same[m].rack = ""
		}
		none := assignTasks(tasks, same, replicas, warm)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			checkRacks(t, tasks, members, replicas, plan)
			if !reflect.DeepEqual(one, none) {
				t.Fatalf("one rack for all: %+v; no racks: %+v", one, none)
			}
		})
	}
}

// checkRacks checks one owner a task, its standbys (distinct, not the
// owner, as many as wanted), and one of them outside the owner's rack
// whenever a member is.
func checkRacks(t *testing.T, tasks int32, members []taskMember, replicas int, plan taskPlan) {
	t.Helper()
	owner := map[int32]int{}
	for i, ts := range plan.active {
		for _, task := range ts {
			if _, dup := owner[task]; dup {
				t.Fatalf("task %d assigned twice: %+v", task, plan.active)
			}
			owner[task] = i
		}
	}
	if len(owner) != int(tasks) {
		t.Fatalf("%d of %d tasks assigned: %+v", len(owner), tasks, plan.active)
	}
	want := min(replicas, len(members)-1)
	outside := func(i, o int) bool {
		return members[i].rack == "" || members[o].rack == "" || members[i].rack != members[o].rack
	}
	for task, o := range owner {
		var by []int
		for i, ts := range plan.standby {
			if slices.Contains(ts, task) {
				by = append(by, i)
			}
		}
		// One more for a task that waits, its warm-up.
		warmup := plan.waits != nil && plan.waits[task] >= 0 && slices.Contains(by, plan.waits[task])
		if (len(by) != want && !(warmup && len(by) == want+1)) || slices.Contains(by, o) {
			t.Fatalf("task %d of member %d has standbys on %v, want %d others: %+v", task, o, by, want, plan)
		}
		someOutside := slices.ContainsFunc(by, func(i int) bool { return outside(i, o) })
		anyOutside := false
		for i := range members {
			anyOutside = anyOutside || (i != o && outside(i, o))
		}
		if want > 0 && anyOutside && !someOutside {
			t.Fatalf("task %d of member %d (rack %q): standbys %v all in its rack, though a member is outside: %+v (members %+v)", task, o, members[o].rack, by, plan, members)
		}
	}
}

// A member that joins a group whose tasks all have caught-up copies
// elsewhere gets warm-ups first: the tasks its share would take stay
// where they run, at most MaxWarmupReplicas of them get a warm-up there,
// and a task moves once its warm-up reports that it caught up. A standby
// already there is a warm-up without counting against the bound.
func TestAssignTasksWarmsUpBeforeMoving(t *testing.T) {
	warm := warmups{most: 2, lag: 100}
	run := []int32{0, 1, 2, 3, 4, 5}
	copies := map[int32]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000, 4: 1000, 5: 1000}
	members := []taskMember{{owned: run, local: copies}, {}}
	plan := assignTasks(6, members, 0, warm)
	if want := (taskPlan{active: [][]int32{run, nil}, standby: [][]int32{nil, {3, 4}}, warmup: [][]int32{nil, {3, 4}}, waits: []int{-1, -1, -1, 1, 1, 1}}); !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan %+v, want %+v (3, 4 and 5 wait; two warm-ups)", plan, want)
	}
	// Task 3's warm-up caught up as its member measured it (lag 20),
	// task 4's as the leader sees it (60 below the owner's copy): both
	// move; 5 waits with a warm-up of its own.
	members[1] = taskMember{local: map[int32]int64{3: 500, 4: 940}, lag: map[int32]int64{3: 20, 4: -1}}
	plan = assignTasks(6, members, 0, warm)
	if want := (taskPlan{active: [][]int32{{0, 1, 2, 5}, {3, 4}}, standby: [][]int32{nil, {5}}, warmup: [][]int32{nil, {5}}, waits: []int{-1, -1, -1, -1, -1, 1}}); !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan %+v, want %+v", plan, want)
	}
	// Without warm-ups the tasks move at once.
	plan = assignTasks(6, []taskMember{{owned: run, local: copies}, {}}, 0, warmups{})
	if want := [][]int32{{0, 1, 2}, {3, 4, 5}}; !reflect.DeepEqual(plan.active, want) {
		t.Fatalf("active %v without warm-ups, want %v", plan.active, want)
	}
	// With a standby each, the joining member stands by for every task
	// (the only other member): the three it waits for are warm-ups
	// without taking from the bound.
	plan = assignTasks(6, []taskMember{{owned: run, local: copies}, {}}, 1, warmups{most: 1, lag: 100})
	if want := (taskPlan{active: [][]int32{run, nil}, standby: [][]int32{nil, run}, warmup: [][]int32{nil, {3, 4, 5}}, waits: []int{-1, -1, -1, 1, 1, 1}}); !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan %+v, want %+v", plan, want)
	}
	// A changelog within the lag from its start: nothing to warm up.
	small := map[int32]int64{0: 90, 1: 90, 2: 90, 3: 90, 4: 90, 5: 90}
	plan = assignTasks(6, []taskMember{{owned: run, local: small}, {}}, 0, warm)
	if want := [][]int32{{0, 1, 2}, {3, 4, 5}}; !reflect.DeepEqual(plan.active, want) || len(plan.warmup[1]) != 0 {
		t.Fatalf("plan %+v for changelogs of 90 offsets, want %v and no warm-ups", plan, want)
	}
	// A task waiting for a member stays with the member running it, not
	// with a less loaded member whose copy is caught up too (that would
	// move it twice; found by review).
	members = []taskMember{
		{owned: []int32{0, 1, 2, 3}, local: map[int32]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000}},
		{},
		{local: map[int32]int64{2: 990, 3: 990}, lag: map[int32]int64{2: 5, 3: 5}},
	}
	plan = assignTasks(4, members, 0, warm)
	if want := [][]int32{{0, 1, 3}, nil, {2}}; !reflect.DeepEqual(plan.active, want) || !reflect.DeepEqual(plan.warmup, [][]int32{nil, {3}, nil}) {
		t.Fatalf("plan %+v, want %v with a warm-up of 3 on member 1", plan, want)
	}
	// The owner crashed and the freshest copy's member is full: the task
	// goes to it rather than to a member that would restore it whole.
	members = []taskMember{
		{owned: []int32{0, 1}, local: map[int32]int64{0: 1000, 1: 1000, 2: 995}, lag: map[int32]int64{2: 5}},
		{},
	}
	plan = assignTasks(3, members, 0, warm)
	if want := [][]int32{{0, 1, 2}, nil}; !reflect.DeepEqual(plan.active, want) || !reflect.DeepEqual(plan.warmup, [][]int32{nil, {2}}) {
		t.Fatalf("plan %+v, want %v with a warm-up of 2 on member 1", plan, want)
	}
}

// Random groups with warm-ups: against the plan without them, a task
// changes owner only when its place's copy is not caught up and its new
// owner's is; it then waits with a warm-up at its place unless the bound
// was used; warm-ups are standbys, never the owner's, and the plan is
// otherwise what checkPlan wants of the standbys.
func TestAssignTasksWarmupInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 20000 {
		n := 1 + r.IntN(6)
		tasks := int32(r.IntN(24))
		replicas := r.IntN(3)
		warm := warmups{most: 1 + r.IntN(3), lag: int64(r.IntN(100))}
		members := make([]taskMember, n)
		for t := range tasks {
			if r.IntN(4) > 0 {
				m := r.IntN(n)
				members[m].owned = append(members[m].owned, t)
			}
			for m := range members {
				if r.IntN(3) == 0 {
					if members[m].local == nil {
						members[m].local, members[m].lag = map[int32]int64{}, map[int32]int64{}
					}
					members[m].local[t] = int64(r.IntN(300))
					members[m].lag[t] = int64(r.IntN(200)) - 1
				}
			}
		}
		plan := assignTasks(tasks, members, replicas, warm)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			newest := func(task int32) int64 {
				best := int64(-1)
				for _, m := range members {
					if off, ok := m.local[task]; ok {
						best = max(best, off)
					}
				}
				return best
			}
			caughtUp := func(i int, task int32) bool {
				m := members[i]
				if slices.Contains(m.owned, task) {
					return true
				}
				if lag, ok := m.lag[task]; ok && lag >= 0 && lag <= warm.lag {
					return true
				}
				off, ok := m.local[task]
				if !ok {
					off = 0
				}
				return newest(task)-off <= warm.lag
			}
			ownerIn := func(p taskPlan) []int {
				o := make([]int, tasks)
				for i, ts := range p.active {
					for _, task := range ts {
						o[task] = i
					}
				}
				return o
			}
			// was: the even spread, before tasks wait.
			now := ownerIn(plan)
			was := slices.Clone(now)
			count := make([]int, n)
			for task, place := range plan.waits {
				if place >= 0 {
					was[task] = place
				}
				count[was[task]]++
			}
			if len(count) > 0 && slices.Max(count)-slices.Min(count) > 1 {
				t.Fatalf("the spread before tasks wait is uneven, %v: %+v", count, plan)
			}
			added := 0
			for task := range tasks {
				place := was[task]
				if now[task] == place {
					// It stays at its place only if the place is
					// caught up or nobody is.
					if !caughtUp(place, task) {
						for i := range members {
							if caughtUp(i, task) {
								t.Fatalf("task %d stays at its place %d, which is not caught up, while member %d is: %+v", task, place, i, plan)
							}
						}
					}
					continue
				}
				// A member running it keeps it (it is caught up).
				var owners []int
				for i, m := range members {
					if slices.Contains(m.owned, task) {
						owners = append(owners, i)
					}
				}
				if len(owners) > 0 {
					if !slices.Contains(owners, now[task]) {
						t.Fatalf("task %d moved from its place %d to %d, not to a member running it %v: %+v", task, place, now[task], owners, plan)
					}
				}
				if caughtUp(place, task) || !caughtUp(now[task], task) {
					t.Fatalf("task %d moved from its place %d (caught up %v) to %d (caught up %v): %+v", task, place, caughtUp(place, task), now[task], caughtUp(now[task], task), plan)
				}
				if !slices.Contains(plan.warmup[place], task) && slices.Contains(plan.standby[place], task) {
					t.Fatalf("task %d waits for member %d, which stands by for it, without a warm-up: %+v", task, place, plan)
				}
			}
			// Each task has its standbys, distinct and not its
			// owner, and one more where a warm-up was added.
			want := min(replicas, n-1)
			per := map[int32][]int{}
			for i, ts := range plan.standby {
				for _, task := range ts {
					if now[task] == i || slices.Contains(per[task], i) {
						t.Fatalf("member %d stands by for task %d it runs or twice: %+v", i, task, plan)
					}
					per[task] = append(per[task], i)
				}
			}
			for task := range tasks {
				switch len(per[task]) {
				case want:
				case want + 1:
					added++
					if !slices.Contains(plan.warmup[was[task]], task) || now[task] == was[task] {
						t.Fatalf("task %d has a standby more than %d without waiting for a warm-up: %+v", task, want, plan)
					}
				default:
					t.Fatalf("task %d has %d standbys, want %d: %+v", task, len(per[task]), want, plan)
				}
			}
			for i, ws := range plan.warmup {
				for _, task := range ws {
					if now[task] == i || was[task] != i || !slices.Contains(plan.standby[i], task) {
						t.Fatalf("member %d warms up task %d it runs, is not its place, or does not stand by for: %+v", i, task, plan)
					}
				}
			}
			if added > warm.most {
				t.Fatalf("%d warm-ups added, above the bound %d: %+v", added, warm.most, plan)
			}
			// Waiting tasks beyond the bound have no warm-up only
			// when the bound was used up.
			for task := range tasks {
				place := was[task]
				if now[task] != place && !slices.Contains(plan.warmup[place], task) && added < warm.most {
					t.Fatalf("task %d waits for member %d without a warm-up, %d of %d added: %+v", task, place, added, warm.most, plan)
				}
			}
		})
	}
}

// A warm-up that caught up (within the leader's lag, which the
// assignment carries) asks for a rebalance once; no other asks while one
// is out; an ask the leader did not follow (the task still a warm-up)
// lets the next wait 1 s, then twice as long each time up to a minute; a
// task on its way here (incoming) keeps its ask standing; once it runs
// here the next warm-up may ask at once.
func TestWarmupAsksBackOff(t *testing.T) {
	in := standbyMember(nil, "in")
	in.cfg.RebalanceTimeout = 30 * time.Second // an ask not answered may be made again after it
	s := in.standbys
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1")) // not in a group: ForceRebalance does nothing
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	asks := func() float64 {
		var m dto.Metric
		if err := in.m.warmupAsks.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	want := func(n float64, what string) {
		t.Helper()
		if got := asks(); got != n {
			t.Fatalf("%s: %v asks, want %v", what, got, n)
		}
	}
	both := groupview.Standbys{Tasks: []int32{1, 2, 3}, Warmup: []int32{1, 2}, AcceptableLag: 100}
	s.assigned(both)
	s.warmedUp(1, 0)
	want(0, "without a session's client")
	s.session(cl)
	s.warmedUp(1, 101)
	s.warmedUp(3, 0)
	want(0, "above the leader's lag, or not a warm-up")
	s.warmedUp(1, 100)
	want(1, "caught up")
	s.warmedUp(2, 0)
	want(1, "while an ask is out")
	for _, gap := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute} {
		s.assigned(both) // not followed
		if s.askGap != gap || time.Until(s.askAfter) <= 0 {
			t.Fatalf("after an ask not followed: gap %v, next in %v; want %v", s.askGap, time.Until(s.askAfter), gap)
		}
		before := asks()
		s.warmedUp(1, 0)
		want(before, "before the gap passed")
		s.askAfter = time.Now() // the gap passed
		s.warmedUp(1, 0)
		want(before+1, "after the gap")
	}
	s.assigned(groupview.Standbys{Tasks: []int32{1, 2, 3}, Warmup: []int32{1, 2}, Incoming: []int32{1}, AcceptableLag: 100})
	if s.askTask != 1 || s.askGap != time.Minute {
		t.Fatalf("incoming: ask of %d, gap %v; want the ask of 1 standing, gap a minute", s.askTask, s.askGap)
	}
	before := asks()
	s.askAfter = time.Now()
	s.warmedUp(1, 0)
	want(before, "for an incoming task")
	s.assigned(groupview.Standbys{Tasks: []int32{2, 3}, Warmup: []int32{2}, AcceptableLag: 100}) // 1 runs here
	if s.askTask != -1 || s.askGap != 0 {
		t.Fatalf("arrived: ask of %d, gap %v; want none, 0", s.askTask, s.askGap)
	}
	s.warmedUp(2, 0)
	want(before+1, "the next warm-up, once the last arrived")
}

// randomMembers is a random group of n members over tasks: each task
// claimed by one member two times in three, and copied (at an offset below
// 50) on one member one time in two.
func randomMembers(r *rand.Rand, n int, tasks int32) []taskMember {
	members := make([]taskMember, n)
	for t := range tasks {
		if r.IntN(3) > 0 {
			m := r.IntN(n)
			members[m].owned = append(members[m].owned, t)
		}
		if r.IntN(2) == 0 {
			m := r.IntN(n)
			if members[m].local == nil {
				members[m].local = map[int32]int64{}
			}
			members[m].local[t] = int64(r.IntN(50))
		}
	}
	return members
}

func checkPlan(t *testing.T, tasks int32, members []taskMember, replicas int, plan taskPlan) {
	t.Helper()
	n := len(members)
	owner := map[int32]int{}
	lo, hi := int(tasks), 0
	for i, ts := range plan.active {
		lo, hi = min(lo, len(ts)), max(hi, len(ts))
		for _, task := range ts {
			if _, dup := owner[task]; dup || task < 0 || task >= tasks {
				t.Fatalf("task %d assigned twice or out of range: %v", task, plan.active)
			}
			owner[task] = i
		}
	}
	if len(owner) != int(tasks) || hi-lo > 1 {
		t.Fatalf("%d of %d tasks assigned, %d to %d a member: %v", len(owner), tasks, lo, hi, plan.active)
	}
	want := min(replicas, n-1)
	per := map[int32][]int{}
	most := 0
	for i, ts := range plan.standby {
		most = max(most, len(ts))
		for _, task := range ts {
			if owner[task] == i || slices.Contains(per[task], i) {
				t.Fatalf("member %d stands by for task %d it runs or twice: %+v", i, task, plan)
			}
			per[task] = append(per[task], i)
		}
	}
	for task := range tasks {
		if len(per[task]) != want {
			t.Fatalf("task %d has %d standbys, want %d: %+v", task, len(per[task]), want, plan)
		}
	}
	if limit := (int(tasks)*want + n - 1) / n; want > 0 && most > limit {
		t.Fatalf("a member stands by for %d tasks, above the even share %d: %+v", most, limit, plan.standby)
	}
	least := most
	for _, ts := range plan.standby {
		least = min(least, len(ts))
	}
	if want > 0 && most-least > 1 {
		t.Fatalf("members stand by for %d to %d tasks: %+v (active %+v)", least, most, plan.standby, plan.active)
	}
}

// The balancer end to end, as the group runs it: each member's JoinGroup
// metadata carries its copies, the leader's plan gives a freed task to the
// member holding its most recent copy (here against the members' order),
// the standbys reach each member in its assignment, and under the
// cooperative protocol a task moving between two members is first only
// revoked.
func TestStandbyBalancerThroughTheGroupProtocol(t *testing.T) {
	newMember := func(copies map[int32]int64) *Instance { return standbyMember(copies, "in") }
	balance := func(ins []*Instance, owned []map[string][]int32) map[string]map[string][]int32 {
		t.Helper()
		subs := make([][]string, len(ins))
		gens := make([]int32, len(ins))
		for i := range ins {
			subs[i], gens[i] = []string{"in"}, 7
		}
		return balanceOnce(t, ins, subs, owned, gens, map[string]int32{"in": 6})
	}
	// The member that ran tasks 0 and 1 is gone. m2 holds the freshest
	// copy of 0, m1 that of 1.
	m1 := newMember(map[int32]int64{2: 500, 3: 500, 0: 100, 1: 300})
	m2 := newMember(map[int32]int64{4: 500, 5: 500, 0: 300, 1: 100})
	got := balance([]*Instance{m1, m2}, []map[string][]int32{{"in": {2, 3}}, {"in": {4, 5}}})
	if want := map[string]map[string][]int32{"m1": {"in": {1, 2, 3}}, "m2": {"in": {0, 4, 5}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("assigned %v, want %v", got, want)
	}
	for i, in := range []*Instance{m1, m2} {
		if len(in.standbys.want) != 3 {
			t.Fatalf("m%d stands by for %v, want the other's 3 tasks", i+1, in.standbys.want)
		}
	}

	// m3 joins, holding a recent copy of task 2 and an old one of 4: m1
	// gives up 2, m2 gives up 4 (the others have no copy elsewhere), and
	// in this first round m3 gets neither: their owners revoke them first.
	m1.standbys.copies = unmeasured(map[int32]int64{1: 600, 2: 500, 3: 500, 0: 100}) // running 1 since
	m2.standbys.copies = unmeasured(map[int32]int64{0: 600, 4: 500, 5: 500, 1: 100})
	m3 := newMember(map[int32]int64{2: 499, 4: 10})
	got = balance([]*Instance{m1, m2, m3}, []map[string][]int32{{"in": {1, 2, 3}}, {"in": {0, 4, 5}}, nil})
	if want := map[string]map[string][]int32{"m1": {"in": {1, 3}}, "m2": {"in": {0, 5}}, "m3": {}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("assigned %v, want %v", got, want)
	}
	// The next round, with the two revoked: m3 takes them.
	got = balance([]*Instance{m1, m2, m3}, []map[string][]int32{{"in": {1, 3}}, {"in": {0, 5}}, nil})
	if want := map[string]map[string][]int32{"m1": {"in": {1, 3}}, "m2": {"in": {0, 5}}, "m3": {"in": {2, 4}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("assigned %v, want %v", got, want)
	}
	for i, in := range []*Instance{m1, m2, m3} {
		if len(in.standbys.want) != 2 {
			t.Fatalf("m%d stands by for %v, want 2 tasks", i+1, in.standbys.want)
		}
	}
}

// Warm-ups through the group protocol and its cooperative two rounds: a
// joining member first gets the tasks of its share as warm-ups; once
// their copies caught up (as it measured them), the plan moves them,
// withheld while their owner revokes them, and meanwhile the member keeps
// following them (incoming), so that the next round, which sees the
// owner's last commit beyond the acceptable lag, still finds them caught
// up and gives them over (found by review: they bounced back).
func TestStandbyBalancerWarmsUpThroughTheGroupProtocol(t *testing.T) {
	newMember := func() *Instance {
		in := standbyMember(nil, "in")
		in.cfg.MaxWarmupReplicas, in.cfg.AcceptableRecoveryLag = 2, 100
		return in
	}
	copies := func(off, lag int64, tasks ...int32) map[int32]groupview.Copy {
		m := map[int32]groupview.Copy{}
		for _, t := range tasks {
			m[t] = groupview.Copy{Offset: off, Lag: lag}
		}
		return m
	}
	m1, m2 := newMember(), newMember()
	balance := func(owned1, owned2 []int32) map[string]map[string][]int32 {
		t.Helper()
		return balanceOnce(t, []*Instance{m1, m2}, [][]string{{"in"}, {"in"}},
			[]map[string][]int32{{"in": owned1}, {"in": owned2}}, []int32{7, 7}, map[string]int32{"in": 4})
	}
	m1.standbys.copies = copies(1000, 0, 0, 1, 2, 3)
	got := balance([]int32{0, 1, 2, 3}, nil)
	if want := map[string]map[string][]int32{"m1": {"in": {0, 1, 2, 3}}, "m2": {}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the join: %v, want %v", got, want)
	}
	if !reflect.DeepEqual(m2.standbys.warm, map[int32]bool{2: true, 3: true}) || len(m2.standbys.want) != 4 || m2.standbys.askLag != 100 {
		t.Fatalf("the joining member: standbys %v, warm-ups %v, lag %d; want all 4, warm-ups 2 and 3, 100", m2.standbys.want, m2.standbys.warm, m2.standbys.askLag)
	}
	// Caught up as m2 measured (lag 5), 300 offsets behind m1's commits.
	m1.standbys.copies = copies(1300, 0, 0, 1, 2, 3)
	m2.standbys.copies = copies(1000, 5, 0, 1, 2, 3)
	got = balance([]int32{0, 1, 2, 3}, nil)
	if want := map[string]map[string][]int32{"m1": {"in": {0, 1}}, "m2": {}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the move's first round: %v, want %v (2 and 3 revoked first)", got, want)
	}
	if !reflect.DeepEqual(m2.standbys.incoming, map[int32]bool{2: true, 3: true}) || !m2.standbys.want[2] || !m2.standbys.want[3] {
		t.Fatalf("the move's first round: m2 follows %v, incoming %v; want 2 and 3 followed and incoming", m2.standbys.want, m2.standbys.incoming)
	}
	// m1 committed 2 and 3 once more as it revoked them.
	m1.standbys.copies = map[int32]groupview.Copy{0: {Offset: 1400}, 1: {Offset: 1400}, 2: {Offset: 1400, Lag: -1}, 3: {Offset: 1400, Lag: -1}}
	got = balance([]int32{0, 1}, nil)
	if want := map[string]map[string][]int32{"m1": {"in": {0, 1}}, "m2": {"in": {2, 3}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("the move's second round: %v, want %v", got, want)
	}
	// Had m2 stopped following them (its lags unknown), they would have
	// gone back to m1: what following incoming tasks prevents.
	m2.standbys.copies = copies(1000, -1, 0, 1, 2, 3)
	got = balance([]int32{0, 1}, nil)
	if want := map[string]map[string][]int32{"m1": {"in": {0, 1, 2, 3}}, "m2": {}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("unfollowed copies: %v, want %v", got, want)
	}
}

// The rack travels in the JoinGroup metadata (Kafka's field for it): the
// leader puts the standbys of a task in another rack than its owner's,
// though a member in the owner's rack holds copies.
func TestStandbyBalancerPlacesStandbysByRack(t *testing.T) {
	m1, m2, m3 := standbyMember(nil, "in"), standbyMember(map[int32]int64{0: 100, 1: 100}, "in"), standbyMember(nil, "in")
	m1.cfg.Rack, m2.cfg.Rack, m3.cfg.Rack = "zone-a", "zone-a", "zone-b"
	var meta kmsg.ConsumerMemberMetadata
	if err := meta.ReadFrom(m1.standbyBalancer().JoinGroupMetadata([]string{"in"}, nil, 3)); err != nil || meta.Rack == nil || *meta.Rack != "zone-a" {
		t.Fatalf("JoinGroup metadata's rack %v, %v; want zone-a", meta.Rack, err)
	}
	subs := [][]string{{"in"}, {"in"}, {"in"}}
	got := balanceOnce(t, []*Instance{m1, m2, m3}, subs, []map[string][]int32{{"in": {0, 1}}, {"in": {2, 3}}, {"in": {4, 5}}}, []int32{3, 3, 3}, map[string]int32{"in": 6})
	if want := map[string]map[string][]int32{"m1": {"in": {0, 1}}, "m2": {"in": {2, 3}}, "m3": {"in": {4, 5}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("assigned %v, want %v", got, want)
	}
	if m2.standbys.want[0] || m2.standbys.want[1] || !m3.standbys.want[0] || !m3.standbys.want[1] {
		t.Fatalf("standbys of m1's tasks: m2 (zone-a, with copies) %v, m3 (zone-b) %v; want them on m3", m2.standbys.want, m3.standbys.want)
	}
}

// standbyMember is an instance for the balancer's tests: one standby,
// these copies, reading topics.
func standbyMember(copies map[int32]int64, topics ...string) *Instance {
	in := &Instance{cfg: Options{StandbyReplicas: 1, InputTopics: topics}, log: slog.New(slog.DiscardHandler)}
	in.m, _ = newMetrics(in)
	in.standbys = newStandbys(in)
	in.standbys.copies = unmeasured(copies)
	return in
}

// unmeasured are copies at these offsets whose lags were not measured
// (files found at a start).
func unmeasured(offsets map[int32]int64) map[int32]groupview.Copy {
	copies := map[int32]groupview.Copy{}
	for t, off := range offsets {
		copies[t] = groupview.Copy{Offset: off, Lag: -1}
	}
	return copies
}

// balanceOnce runs one round of the group protocol over ins: their
// JoinGroup metadata (subscribed to subs, owning owned at generations
// gens), the first one's plan over parts, and each member's parse of its
// assignment, which it returns by member id (m1, m2, …).
func balanceOnce(t *testing.T, ins []*Instance, subs [][]string, owned []map[string][]int32, gens []int32, parts map[string]int32) map[string]map[string][]int32 {
	t.Helper()
	var members []kmsg.JoinGroupResponseMember
	for i, in := range ins {
		b := in.standbyBalancer()
		if b.ProtocolName() != standbyProtocol || b.IsCooperative() != (len(in.cfg.InputTopics) == 1) {
			t.Fatalf("protocol %q, cooperative %v with %d inputs", b.ProtocolName(), b.IsCooperative(), len(in.cfg.InputTopics))
		}
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID = fmt.Sprintf("m%d", i+1)
		m.ProtocolMetadata = b.JoinGroupMetadata(subs[i], owned[i], gens[i])
		members = append(members, m)
	}
	gb, _, err := ins[0].standbyBalancer().MemberBalancer(members)
	if err != nil {
		t.Fatal(err)
	}
	into, err := gb.(kgo.GroupMemberBalancerOrError).BalanceOrError(parts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string][]int32{}
	for _, a := range into.IntoSyncAssignment() {
		i := int(a.MemberID[1]-'0') - 1
		ps, err := ins[i].standbyBalancer().ParseSyncAssignment(a.MemberAssignment)
		if err != nil {
			t.Fatal(err)
		}
		got[a.MemberID] = normalize(ps)
	}
	return got
}

// Several input topics: partition p of each goes to task p's member (an
// eager protocol, as the range balancer's); members reading different
// topics (a rolling change of them) leave no partition unassigned; a
// claim of a member that missed rebalances loses to the newer one.
func TestStandbyBalancerEdges(t *testing.T) {
	two := []string{"a", "b"}
	m1, m2 := standbyMember(nil, two...), standbyMember(nil, two...)
	got := balanceOnce(t, []*Instance{m1, m2}, [][]string{two, two}, []map[string][]int32{nil, nil}, []int32{-1, -1}, map[string]int32{"a": 4, "b": 4})
	if want := map[string]map[string][]int32{"m1": {"a": {0, 2}, "b": {0, 2}}, "m2": {"a": {1, 3}, "b": {1, 3}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("two inputs: %v, want %v", got, want)
	}

	m3 := standbyMember(nil, "a")
	got = balanceOnce(t, []*Instance{m1, m3}, [][]string{two, {"a"}}, []map[string][]int32{nil, nil}, []int32{-1, -1}, map[string]int32{"a": 2, "b": 2})
	seen := map[string]int{}
	for _, parts := range got {
		for topic, ps := range parts {
			for _, p := range ps {
				seen[fmt.Sprint(topic, p)]++
			}
		}
	}
	if len(seen) != 4 || got["m2"]["b"] != nil {
		t.Fatalf("different subscriptions: %v (each of a0 a1 b0 b1 once, none of b to m2)", got)
	}

	s1, s2 := standbyMember(nil, "in"), standbyMember(nil, "in")
	got = balanceOnce(t, []*Instance{s1, s2}, [][]string{{"in"}, {"in"}},
		[]map[string][]int32{{"in": {0}}, {"in": {0, 1}}}, []int32{5, 7}, map[string]int32{"in": 2})
	if want := map[string]map[string][]int32{"m1": {}, "m2": {"in": {0}}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a stale claim: %v, want %v (m2 keeps 0, and 1 waits for its revoke)", got, want)
	}
}

func normalize(m map[string][]int32) map[string][]int32 {
	out := map[string][]int32{}
	for k, v := range m {
		if len(v) > 0 {
			out[k] = slices.Sorted(slices.Values(v))
		}
	}
	return out
}

// The lease of a task's file between its standby and its task: a standby
// starts only for a task not held here, acquire returns once the standby
// closed the file, a release lets the standby start again, an assignment
// without it stops it, and once Run's context ends no standby starts again
// (each that stops would otherwise start anew until stop).
func TestStandbyLease(t *testing.T) {
	in := &Instance{cfg: Options{StandbyReplicas: 1, InputTopics: []string{"in"}, AppID: "lease", StateDir: t.TempDir(), Backend: "bbolt"},
		log: slog.New(slog.DiscardHandler)}
	in.m, _ = newMetrics(in)
	s := newStandbys(in)
	in.standbys = s
	var mu sync.Mutex
	open := map[int32]bool{}
	opened := make(chan int32, 16)
	s.run = func(ctx context.Context, p int32) {
		mu.Lock()
		if open[p] {
			t.Errorf("task %d's file opened twice", p)
		}
		open[p] = true
		mu.Unlock()
		opened <- p
		<-ctx.Done()
		mu.Lock()
		open[p] = false
		mu.Unlock()
	}
	isOpen := func(p int32) bool { mu.Lock(); defer mu.Unlock(); return open[p] }
	running := func(p int32) *standbyRun { s.mu.Lock(); defer s.mu.Unlock(); return s.running[p] }
	gauge := func() float64 {
		var m dto.Metric
		if err := in.m.tasks.WithLabelValues("standby").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.start(ctx)
	s.acquire(3) // a task here holds 3
	s.assigned(groupview.Standbys{Tasks: []int32{1, 2, 3}})
	for range 2 {
		if p := <-opened; p != 1 && p != 2 {
			t.Fatalf("a standby of task %d started", p)
		}
	}
	if running(3) != nil || gauge() != 2 {
		t.Fatalf("standby of the held task 3 running: %v; gauge %v, want 2", running(3) != nil, gauge())
	}
	s.acquire(1)
	if isOpen(1) || running(1) != nil {
		t.Fatal("acquire returned before task 1's standby closed its file")
	}
	s.assigned(groupview.Standbys{Tasks: []int32{1, 2, 3}})
	if running(1) != nil {
		t.Fatal("a standby of task 1 started while its task holds it")
	}
	s.releaseActive(1, 3)
	for range 2 {
		<-opened
	}
	if !isOpen(1) || !isOpen(3) || gauge() != 3 {
		t.Fatalf("after the release: 1 open %v, 3 open %v, gauge %v", isOpen(1), isOpen(3), gauge())
	}
	r := running(1)
	s.assigned(groupview.Standbys{Tasks: []int32{2, 3}})
	<-r.done
	if isOpen(1) || gauge() != 2 {
		t.Fatalf("task 1's standby still open (%v) after an assignment without it; gauge %v", isOpen(1), gauge())
	}
	// Run's context ends: the standbys stop and none starts again.
	r2, r3 := running(2), running(3)
	cancel()
	<-r2.done
	<-r3.done
	if running(2) != nil || running(3) != nil || len(opened) > 0 {
		t.Fatalf("a standby started again after Run's context ended (%d opens)", len(opened))
	}
	s.stop()
	s.assigned(groupview.Standbys{Tasks: []int32{2}})
	if running(2) != nil {
		t.Fatal("a standby started after stop")
	}
}

// A standby's copy cut between two markers is not read: standbyCut waits
// for the queries reading it and refuses new ones (ErrNotLocal) until the
// copy is whole again; a standby dropped is not read either.
func TestStaleQueriesSkipACutCopy(t *testing.T) {
	in := &Instance{log: slog.New(slog.DiscardHandler), clock: wallClock{}}
	in.queries.parts.Store(1)
	in.queries.standbyOn(0, kstate.NewMemory())
	key := []byte("k")
	reading, done := make(chan struct{}), make(chan struct{})
	go func() {
		standby, err := in.QueryStale(key, func(kstate.Scope) error {
			close(reading)
			<-done
			return nil
		})
		if err != nil || !standby {
			t.Errorf("the first read: standby %v, %v", standby, err)
		}
	}()
	<-reading
	cut := make(chan struct{})
	go func() {
		in.queries.standbyCut(0, true)
		close(cut)
	}()
	select {
	case <-cut:
		t.Fatal("the cut went ahead while a query read the copy")
	case <-time.After(50 * time.Millisecond): // asserting a wait, with a bound
	}
	// While the cut waits, no new query reads the copy.
	if _, err := in.QueryStale(key, func(kstate.Scope) error { return nil }); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("a query during the cut: %v, want ErrNotLocal", err)
	}
	close(done)
	<-cut
	if _, err := in.QueryStale(key, func(kstate.Scope) error { return nil }); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("a query of the cut copy: %v, want ErrNotLocal", err)
	}
	in.queries.standbyCut(0, false)
	if standby, err := in.QueryStale(key, func(kstate.Scope) error { return nil }); err != nil || !standby {
		t.Fatalf("a query of the whole copy: standby %v, %v", standby, err)
	}
	if err := in.Query(key, func(kstate.Scope) error { return nil }); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("Query without stale read a standby: %v", err)
	}
	in.queries.standbyOff(0)
	if _, err := in.QueryStale(key, func(kstate.Scope) error { return nil }); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("a query of a dropped standby: %v, want ErrNotLocal", err)
	}
}
