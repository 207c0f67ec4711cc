package sluice

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/groupview"
	"github.com/sluicehq/sluice/kstate"
)

// Standby replicas (Options.StandbyReplicas; Kafka Streams'
// num.standby.replicas). A standby is a copy of a task that another
// instance runs, kept in this instance's state dir, in the file the task
// would use here: it reads the task's changelog partition as the task
// commits (a live read, changelog.RestoreParams.Live) and applies each
// committed epoch, up to its marker, with the marker's offsets, watermark
// and epoch. It writes nothing to Kafka and is no part of any transaction.
//
// When the task fails over to this instance (the group's leader prefers
// the member with the most recent copy, standby_balancer.go), the task's
// restore stops the standby and opens the same file, which is then an
// ordinary kept store: it reads only the changelog tail past the copy's
// last marker, exactly as a task restarted on its own file does. The
// epoch protocol is untouched: a standby's file is never more than a
// prefix of the changelog's committed epochs, which is what a kept file
// is.
//
// Each task file has one holder at a time: a running or restoring task
// (acquire, until releaseActive) or a standby. A standby starts only for a
// task that no task here holds, and a task's restore waits for its
// standby to close the file.
//
// A warm-up replica (Options.MaxWarmupReplicas; Kafka Streams' KIP-441)
// is a standby of a task the leader means this instance to run, kept
// where it runs until this copy catches up: once a round leaves the copy
// within the leader's Options.AcceptableRecoveryLag of the changelog's
// end, the instance asks the group to rebalance (warmedUp), and the
// leader, seeing the copy caught up in this member's metadata, moves the
// task here. A task on its way here (incoming, the cooperative protocol's
// second round) is followed until it arrives.

// standbyIdle bounds how long a standby waits between two rounds: the
// first after a round that applied records, doubling up to the second
// while the partition stays idle.
var standbyIdle = [2]time.Duration{200 * time.Millisecond, 2 * time.Second}

type standbys struct {
	in *Instance

	mu   sync.Mutex
	ctx  context.Context // Run's while it runs, nil otherwise
	want map[int32]bool  // the last assignment's standbys
	warm map[int32]bool  // which of them are warm-ups
	// incoming: which of them are tasks assigned here, withheld until
	// their owner revoked them; askLag: the leader's acceptable lag.
	incoming map[int32]bool
	askLag   int64
	active   map[int32]bool // tasks whose file a task here holds
	running  map[int32]*standbyRun
	copies   map[int32]groupview.Copy // each complete local copy: its changelog offset and lag
	// The ask for a rebalance of a warm-up that caught up (warmedUp):
	// the task asked for in this assignment (-1: none), when the next
	// ask may be, and the wait after an ask the leader did not follow.
	askTask  int32
	askAfter time.Time
	askGap   time.Duration
	// group is the running session's client, which asks (nil between
	// sessions).
	group atomic.Pointer[kgo.Client]
	// slot lets one standby at a time read more than a batch of its
	// changelog (a new standby, or one far behind): the heap a restore
	// holds, and the CPU, stay for the tasks that run.
	slot chan struct{}
	// fallback: the group's last assignment came from the balancer of
	// members without standbys (withoutStandbys), which said so once.
	fallback atomic.Bool
	// run keeps a standby until its context ends: follow, or a test's.
	run func(ctx context.Context, p int32)
}

type standbyRun struct {
	cancel   context.CancelFunc
	stopping bool // cancelled (under standbys.mu)
	done     chan struct{}
}

func newStandbys(in *Instance) *standbys {
	s := &standbys{in: in, want: map[int32]bool{}, warm: map[int32]bool{}, incoming: map[int32]bool{}, active: map[int32]bool{}, running: map[int32]*standbyRun{},
		copies: map[int32]groupview.Copy{}, slot: make(chan struct{}, 1), askTask: -1}
	s.run = s.follow
	return s
}

// start lets standbys run until stop, and notes the copies in the state
// dir: the tasks this instance held before it stopped are its to report.
func (s *standbys) start(ctx context.Context) {
	if s == nil {
		return
	}
	found := s.in.scanCopies()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx = ctx
	// Nothing runs yet: the files are the truth, not what an earlier
	// Run noted.
	s.copies = found
	s.reconcile()
}

// stop ends every standby and waits until each closed its file.
func (s *standbys) stop() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.ctx = nil
	clear(s.want) // the next Run's group assigns them anew
	clear(s.warm)
	clear(s.incoming)
	s.askTask, s.askAfter, s.askGap = -1, time.Time{}, 0
	runs := slices.Collect(maps.Values(s.running))
	s.mu.Unlock()
	for _, r := range runs {
		r.cancel()
		<-r.done
	}
}

// assigned takes the standby part of a new assignment.
func (s *standbys) assigned(sb groupview.Standbys) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	want, warm, incoming := map[int32]bool{}, map[int32]bool{}, map[int32]bool{}
	for _, p := range sb.Tasks {
		want[p] = true
	}
	for _, p := range sb.Warmup {
		warm[p] = want[p]
	}
	for _, p := range sb.Incoming {
		incoming[p] = want[p]
	}
	if !maps.Equal(want, s.want) || !maps.Equal(warm, s.warm) || !maps.Equal(incoming, s.incoming) {
		s.in.log.Info("standby tasks assigned", "tasks", sb.Tasks, "warmups", sb.Warmup, "incoming", sb.Incoming)
	}
	if s.askTask >= 0 {
		now := time.Now()
		switch p := s.askTask; {
		case incoming[p]:
			// On its way here: the ask stands until it arrives.
		case warm[p]:
			// The leader kept it a warm-up (its view of the lag
			// differed): ask again later, and later each time, so
			// that no copy keeps the group rebalancing.
			s.askGap = min(max(2*s.askGap, time.Second), time.Minute)
			s.askAfter, s.askTask = now.Add(s.askGap), -1
		default:
			// It runs here now (or elsewhere: the group changed):
			// the next warm-up may ask at once.
			s.askGap = 0
			s.askAfter, s.askTask = now, -1
		}
	}
	s.want, s.warm, s.incoming, s.askLag = want, warm, incoming, sb.AcceptableLag
	s.reconcile()
}

// session gives the standbys the running session's client (nil when it
// ends), which asks for the rebalances of warm-ups.
func (s *standbys) session(cl *kgo.Client) {
	if s != nil {
		s.group.Store(cl)
	}
}

// warmedUp notes that a round left task p's copy lag changelog offsets
// behind the end. A warm-up within the leader's acceptable lag (which
// the assignment carries) asks the group to rebalance, so that the leader
// moves its task here; not again before askAfter (see assigned).
func (s *standbys) warmedUp(p int32, lag int64) {
	s.mu.Lock()
	cl := s.group.Load()
	now := time.Now()
	if !s.warm[p] || s.incoming[p] || lag > s.askLag || now.Before(s.askAfter) || cl == nil {
		s.mu.Unlock()
		return
	}
	s.askTask = p
	// The next assignment sets when the next ask may be; an ask no
	// assignment answers (the session ended meanwhile) may be made
	// again after this.
	s.askAfter = now.Add(s.in.cfg.RebalanceTimeout + s.askGap)
	s.mu.Unlock()
	s.in.log.Info("warm-up replica caught up; asking the group to rebalance", "task", p, "lag", lag)
	s.in.m.warmupAsks.Inc()
	cl.ForceRebalance()
}

// acquire makes task p's file a task's: the standby of p, if any, stops
// and closes it first. It may be called again for a task that holds it.
func (s *standbys) acquire(p int32) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.active[p] = true
	r := s.running[p]
	if r != nil {
		r.cancel()
		r.stopping = true
	}
	s.mu.Unlock()
	if r != nil {
		<-r.done
		s.in.log.Info("standby replica handed over to its task", "task", p)
	}
}

// releaseActive says task p's file is closed: a standby may take it.
func (s *standbys) releaseActive(ps ...int32) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		delete(s.active, p)
		s.unfollowed(p)
	}
	s.reconcile()
}

// releaseAll is releaseActive of every task: the session closed them all.
func (s *standbys) releaseAll() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.active {
		s.unfollowed(p)
	}
	clear(s.active)
	s.reconcile()
}

// unfollow is unfollowed taking s.mu.
func (s *standbys) unfollow(p int32) {
	s.mu.Lock()
	s.unfollowed(p)
	s.mu.Unlock()
}

// unfollowed says the copy of task p is no longer kept up to date here
// (its task or standby stopped, or its standby's rounds fail): its lag is
// no longer known, and the leader no longer takes it for caught up by it.
// With s.mu held.
func (s *standbys) unfollowed(p int32) {
	if c, ok := s.copies[p]; ok {
		c.Lag = -1
		s.copies[p] = c
	}
}

// removeUnlessHeld runs remove, which deletes task p's file, unless the
// file is a standby's, wanted or running; the lock keeps an assignment
// from starting a standby on the file meanwhile. It reports whether it
// ran remove. The sweep of released tasks' files uses it.
func (s *standbys) removeUnlessHeld(p int32, remove func() error) (bool, error) {
	if s == nil {
		return true, remove()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.want[p] || s.running[p] != nil {
		return false, nil
	}
	err := remove()
	if err == nil {
		delete(s.copies, p)
	}
	return true, err
}

// localCopies is what this member tells the group's leader: the changelog
// offset of each complete copy of a task it holds, running, standing by
// or on disk.
func (s *standbys) localCopies() map[int32]groupview.Copy {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.copies)
}

// noteCopy records that the copy of task p here is complete up to
// changelog offset off, lag offsets behind the changelog's end (0 for a
// task that runs here).
func (s *standbys) noteCopy(p int32, off, lag int64) {
	if s == nil || off <= 0 {
		return
	}
	s.mu.Lock()
	s.copies[p] = groupview.Copy{Offset: off, Lag: lag}
	s.mu.Unlock()
}

// forget drops the copy of task p: its file was deleted.
func (s *standbys) forget(p int32) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.copies, p)
	s.mu.Unlock()
}

// reconcile starts the wanted standbys whose file is free and stops the
// unwanted ones. With s.mu held.
func (s *standbys) reconcile() {
	// Not once Run's context ended: the standbys that stop then must not
	// start again while the instance takes its last checkpoint.
	if s.ctx != nil && s.ctx.Err() == nil {
		for _, p := range slices.Sorted(maps.Keys(s.want)) {
			if !s.active[p] && s.running[p] == nil {
				s.launch(p)
			}
		}
	}
	live := 0
	for p, r := range s.running {
		if !s.want[p] || s.ctx == nil || s.ctx.Err() != nil {
			r.cancel()
			r.stopping = true
		}
		if !r.stopping {
			live++
		}
	}
	s.in.m.tasks.WithLabelValues("standby").Set(float64(live))
}

// launch runs task p's standby until it is cancelled. With s.mu held.
func (s *standbys) launch(p int32) {
	ctx, cancel := context.WithCancel(s.ctx)
	r := &standbyRun{cancel: cancel, done: make(chan struct{})}
	s.running[p] = r
	go func() {
		s.run(ctx, p)
		cancel()
		s.in.m.standbyOffset.DeleteLabelValues(taskLabel(p))
		s.in.m.standbyLag.DeleteLabelValues(taskLabel(p))
		s.in.log.Info("standby replica stopped", "task", p)
		s.mu.Lock()
		if s.running[p] == r {
			delete(s.running, p)
		}
		s.unfollowed(p)
		// Wanted again while it stopped: it starts anew.
		s.reconcile()
		s.mu.Unlock()
		close(r.done)
	}()
}

// follow keeps task p's copy up to date until ctx ends, starting over
// after a failure (a broker down, a corrupt file) with a backoff.
func (s *standbys) follow(ctx context.Context, p int32) {
	backoff := time.Second
	for {
		// A standby that got through a round starts its backoff anew.
		err := s.keep(ctx, p, func() { backoff = time.Second })
		if ctx.Err() != nil {
			return
		}
		s.unfollow(p) // until a round succeeds again
		s.in.log.Warn("standby replica failed; retrying", "task", p, "err", err, "retry_in", backoff)
		if sleep(ctx, backoff) != nil {
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// keep opens task p's file as a task's restore does (a corrupt file moved
// aside, a stale one started over) and applies the changelog's committed
// epochs to it, round after round, calling rounded after each. A round
// that fails with an error Kafka says to retry (a leader moving, a broker
// restarting) is tried again with the file kept open. Once the copy is
// whole to an epoch, QueryStale reads it.
func (s *standbys) keep(ctx context.Context, p int32, rounded func()) error {
	in := s.in
	be, meta, err := in.openStore(p, false)
	if err != nil {
		return err
	}
	readable := false
	closeCopy := func() {
		if readable {
			in.queries.standbyOff(p) // before the file closes
			readable = false
		}
		be.Close()
	}
	defer func() {
		if be != nil {
			closeCopy()
		}
	}()
	in.log.Info("standby replica started", "task", p, "epoch", meta.Epoch, "changelog_offset", meta.ChangelogOffset)
	idle, failing := standbyIdle[0], false
	for {
		res, err := in.readChangelog(ctx, p, be, meta, s.round(p))
		var ke *kerr.Error
		switch {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, changelog.ErrStateBehind):
			// The records the copy needs next were deleted: start
			// over, as a task's restore does.
			closeCopy()
			in.log.Warn("standby replica is behind its changelog's start; starting it over", "task", p, "err", err)
			s.forget(p)
			if be, meta, err = in.openStore(p, true); err != nil {
				return err
			}
			continue
		case errors.As(err, &ke) && ke.Retriable:
			if !failing {
				in.log.Warn("standby replica's round failed; trying again", "task", p, "err", err)
				s.unfollow(p) // until a round succeeds again
			}
			failing = true
			if err := sleep(ctx, idle); err != nil {
				return err
			}
			idle = min(2*idle, standbyIdle[1])
			// A round may have applied batches before it failed.
			if meta, err = be.Meta(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if failing {
			in.log.Info("standby replica's rounds succeed again", "task", p)
		}
		failing = false
		rounded()
		if meta, err = be.Meta(); err != nil {
			return err
		}
		if wholeCopy(meta) {
			// 1 when caught up: the commit's control record follows
			// the last marker.
			lag := max(res.End-meta.ChangelogOffset, 0)
			s.noteCopy(p, meta.ChangelogOffset, lag)
			if readable {
				// Whole to the last marker again (a round that
				// failed halfway stays cut until one ends whole).
				in.queries.standbyCut(p, false)
			} else {
				in.queries.standbyOn(p, be)
				readable = true
			}
			in.m.standbyOffset.WithLabelValues(taskLabel(p)).Set(float64(meta.ChangelogOffset))
			in.m.standbyLag.WithLabelValues(taskLabel(p)).Set(float64(lag))
			s.warmedUp(p, lag) // with the copy the leader will see
		}
		in.m.standbyRecords.Add(float64(res.Records))
		// A round lists the partition's offsets (three requests): at
		// most one a standbyIdle[0], however busy the partition.
		if res.Records > 0 {
			idle = standbyIdle[0]
		}
		if err := sleep(ctx, idle); err != nil {
			return err
		}
		if res.Records == 0 {
			idle = min(2*idle, standbyIdle[1])
		}
	}
}

// round adapts a changelog read to a standby's round of task p: live, with
// Run's client and the standbys' turn, no group check or progress gauges,
// and no query reading the copy while a batch cuts it between two markers
// (it could show an at-least-once orphan, a value no epoch committed).
func (s *standbys) round(p int32) func(*changelog.RestoreParams) {
	return func(rp *changelog.RestoreParams) {
		rp.Live, rp.Client, rp.Group, rp.Progress = true, s.in.admCl, "", nil
		rp.Admit = func(ctx context.Context, records int64) (func(), error) { return s.admit(ctx, p, records) }
		apply := rp.Apply
		rp.Apply = func(muts []kstate.Mutation, m kstate.Meta) error {
			if m.Partial {
				s.in.queries.standbyCut(p, true) // before the cut is written
			}
			return apply(muts, m)
		}
	}
}

// admit is admitRestore for standbys: one at a time reads more than a
// batch (their own turn, so that a failover's restore never waits behind
// a standby).
func (s *standbys) admit(ctx context.Context, p int32, records int64) (func(), error) {
	select {
	case s.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.in.log.Debug("standby replica reading more than a batch of its changelog", "task", p, "records", records)
	return func() { <-s.slot }, nil
}

// scanCopies reads the meta of each task file in the state dir: the
// copies this instance holds before any task or standby runs.
func (in *Instance) scanCopies() map[int32]groupview.Copy {
	found := map[int32]groupview.Copy{}
	entries, err := os.ReadDir(in.stateDir())
	if err != nil {
		return found // no state dir yet
	}
	for _, e := range entries {
		p, ok := taskOfFile(e.Name())
		if !ok {
			continue
		}
		be, err := in.cfg.OpenBackend(in.cfg.Backend, in.stateDir(), taskName(p))
		if err != nil {
			continue // the task's restore deals with it
		}
		if meta, err := be.Meta(); err == nil && wholeCopy(meta) && in.stale(meta) == "" {
			found[p] = groupview.Copy{Offset: meta.ChangelogOffset, Lag: -1}
		}
		be.Close()
	}
	return found
}
