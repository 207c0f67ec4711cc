package barrier

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// FuzzStep drives a Coordinator with random event sequences, legal and
// illegal, and checks the protocol against a model that knows only the
// contract, not the implementation:
//
//   - ActApply only from a CommitDone that followed ActCommit of the same
//     epoch, with no abort in between;
//   - epoch numbers (Epoch() and every action's) never decrease; Applied
//     advances by one, Aborted keeps the number;
//   - never two checkpoints in flight: a barrier only when the last one was
//     applied or aborted;
//   - every event the protocol does not allow fails with ErrIllegalEvent,
//     every event it allows is accepted;
//   - Failed is terminal and answers the first failure again; Done is left
//     only for Failed and never with a checkpoint;
//   - no work is lost: Done only when every record was committed or
//     rewound; an interval barrier only for an epoch with work, after
//     Interval and MinPause; a timeout only past Timeout;
//   - failures stay within TolerableFailures and reset on Applied.
//
// The first five bytes pick the config and first epoch; every later byte is
// an event, some taking the next byte as argument.
func FuzzStep(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 1, 9, 0x07, 2, 0, 20, 3, 0, 5, 7, 2, 0, 20, 3, 0, 6, 8, 11})
	f.Add([]byte{3, 1, 2, 1, 0, 9, 0x0f, 15, 15, 15, 15, 15, 15, 15, 15, 10, 15, 15, 15, 15, 11, 15, 15, 15, 15})
	f.Add([]byte{1, 7, 3, 3, 2, 9, 0x03, 2, 12, 3, 0, 2, 5, 7, 9, 0x01, 0, 200, 0, 200, 15, 15, 15})
	f.Add([]byte{2, 0, 0, 0, 3, 9, 0x01, 2, 0, 10, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15})
	f.Add([]byte{0, 0, 0, 1, 1, 10, 15, 15, 15, 9, 0, 2, 13, 15, 14, 4, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 5 {
			return
		}
		cfg := Config{
			Interval:          time.Duration(data[0]%8+1) * 10 * time.Millisecond,
			Timeout:           time.Duration(data[1]%8+1) * 25 * time.Millisecond,
			MinPause:          time.Duration(data[2]%4) * 20 * time.Millisecond,
			TolerableFailures: int(data[3] % 4),
		}
		first := []uint64{0, 1, 1000, math.MaxUint64 - 2}[data[4]%4]
		newModel(t, cfg, first).run(data[5:])
	})
}

type stage int

const (
	idle       stage = iota // no checkpoint in flight
	aligning                // ActEndEpoch returned
	committing              // ActCommit returned
	applying                // ActApply returned
	aborting                // ActAbort returned
)

type model struct {
	t   *testing.T
	cfg Config
	c   *Coordinator
	now time.Time
	log []logEntry // the last events, for the failure message

	stage      stage
	epoch      uint64
	tasks      []int32
	asked      []int32 // tasks of the barrier in flight
	ready      map[int32]bool
	ckptStart  time.Time
	epochStart time.Time
	lastEnd    time.Time
	dirty      bool // work not yet behind a barrier
	failures   int

	failed  bool
	failErr error
	done    bool
	shut    bool // shutdown requested
}

func newModel(t *testing.T, cfg Config, first uint64) *model {
	return &model{
		t: t, cfg: cfg, c: New(cfg, t0, first), now: t0,
		epoch: first, ready: map[int32]bool{}, epochStart: t0, lastEnd: t0,
	}
}

type logEntry struct {
	at  time.Duration
	ev  event
	act Action
}

// event names what was sent; task is TaskReady's argument.
type event struct {
	name  string
	task  int32
	tasks []int32
}

func (e event) String() string {
	switch e.name {
	case "TaskReady":
		return fmt.Sprintf("TaskReady(%d)", e.task)
	case "SetTasks":
		return fmt.Sprintf("SetTasks(%v)", e.tasks)
	}
	return e.name
}

func (m *model) fatalf(format string, args ...any) {
	m.t.Helper()
	msg := fmt.Sprintf(format, args...) + "\nlast events:"
	for _, l := range m.log {
		msg += fmt.Sprintf("\n  t=%v %v -> %v", l.at, l.ev, l.act)
	}
	m.t.Fatal(msg)
}

func (m *model) run(ops []byte) {
	boom := errors.New("boom")
	for i := 0; i < len(ops); i++ {
		arg := func() byte {
			if i+1 < len(ops) {
				i++
				return ops[i]
			}
			return 0
		}
		c := m.c
		var ev event
		var legal bool
		var act Action
		switch op := ops[i] % 16; op {
		case 0:
			m.now = m.now.Add(time.Duration(arg()) * 5 * time.Millisecond)
			ev, legal, act = event{name: "Tick"}, true, c.Tick(m.now)
		case 1:
			ev, legal, act = event{name: "Tick"}, true, c.Tick(m.now)
		case 2:
			ev, act = event{name: "Work"}, c.Work(m.now)
			legal = !m.done && m.stage != aborting && len(m.tasks) > 0
		case 3, 4:
			task := int32(arg() % 8)
			if op == 3 && len(m.asked) > 0 {
				task = m.asked[int(task)%len(m.asked)]
			}
			ev, legal, act = m.taskReady(task)
		case 5:
			ev, legal, act = event{name: "CommitDone"}, m.stage == committing, c.CommitDone(m.now)
		case 6:
			ev, legal, act = event{name: "CommitFailed"}, m.stage == committing, c.CommitFailed(boom, m.now)
		case 7:
			ev, legal, act = event{name: "Applied"}, m.stage == applying, c.Applied(m.now)
		case 8:
			ev, legal, act = event{name: "Aborted"}, m.stage == aborting, c.Aborted(m.now)
		case 9:
			bits := arg()
			var tasks []int32
			for b := range 8 {
				if bits&(1<<b) != 0 {
					tasks = append(tasks, int32(b))
				}
			}
			ev, legal, act = m.setTasks(tasks)
		case 10:
			ev, legal, act = event{name: "RequestSavepoint"}, !m.done, c.RequestSavepoint(m.now)
		case 11:
			ev, legal, act = event{name: "RequestShutdown"}, true, c.RequestShutdown(m.now)
			if !m.failed {
				m.shut = true
			}
		case 12:
			ev, legal, act = event{name: "RequestRevoke"}, true, c.RequestRevoke(m.now)
		case 13:
			ev, act = event{name: "EpochFailed"}, c.EpochFailed(boom, m.now)
			legal = !m.done && (m.stage == idle || m.stage == aligning || m.stage == committing)
		case 14:
			ev, legal, act = event{name: "ApplyFailed"}, m.stage == applying, c.ApplyFailed(boom, m.now)
		case 15:
			ev, legal, act = m.next()
		}
		if len(m.log) == 32 {
			m.log = append(m.log[:0], m.log[1:]...)
		}
		m.log = append(m.log, logEntry{m.now.Sub(t0), ev, act})
		m.check(ev, legal, act)
	}
}

// next is the event a well-behaved engine would send now, so that sequences
// get deep into the protocol instead of failing on the first illegal event.
func (m *model) next() (event, bool, Action) {
	c := m.c
	switch m.stage {
	case aligning:
		for _, task := range m.asked {
			if !m.ready[task] {
				return m.taskReady(task)
			}
		}
	case committing:
		return event{name: "CommitDone"}, true, c.CommitDone(m.now)
	case applying:
		return event{name: "Applied"}, true, c.Applied(m.now)
	case aborting:
		return event{name: "Aborted"}, true, c.Aborted(m.now)
	}
	if len(m.tasks) == 0 {
		return m.setTasks([]int32{0, 1})
	}
	m.now = m.now.Add(7 * time.Millisecond)
	return event{name: "Work"}, !m.done, c.Work(m.now)
}

func (m *model) taskReady(task int32) (event, bool, Action) {
	legal := m.stage == aligning && slices.Contains(m.asked, task) && !m.ready[task]
	return event{name: "TaskReady", task: task}, legal, m.c.TaskReady(task, m.now)
}

func (m *model) setTasks(tasks []int32) (event, bool, Action) {
	act := m.c.SetTasks(tasks)
	legal := !m.done && m.stage == idle
	for _, old := range m.tasks {
		if m.dirty && !slices.Contains(tasks, old) {
			legal = false
		}
	}
	return event{name: "SetTasks", tasks: tasks}, legal, act
}

func (m *model) check(ev event, legal bool, act Action) {
	m.t.Helper()
	name := ev.name
	c := m.c
	if m.failed {
		if act.Kind != ActFail || act.Err != m.failErr || c.Phase() != Failed {
			m.fatalf("%v after failing = %v (phase %v), want the first failure again", ev, act, c.Phase())
		}
		return
	}
	if !legal {
		if act.Kind != ActFail || !errors.Is(act.Err, ErrIllegalEvent) {
			m.fatalf("illegal %v = %v, want an illegal-event failure", ev, act)
		}
	} else if errors.Is(act.Err, ErrIllegalEvent) {
		m.fatalf("legal %v = %v, rejected", ev, act)
	}
	if c.Epoch() < m.epoch {
		m.fatalf("epoch went back from %d to %d", m.epoch, c.Epoch())
	}
	if act.Kind != ActNone && act.Epoch != c.Epoch() {
		m.fatalf("%v for epoch %d while the current epoch is %d", act, act.Epoch, c.Epoch())
	}

	// The outcome of the event itself, before the action it returned.
	if legal {
		switch name {
		case "Work":
			if m.stage != aligning {
				m.dirty = true // aligning: a record of the ending epoch
			}
		case "Applied":
			m.epoch++
			m.failures = 0
			m.stage = idle
			m.epochStart, m.lastEnd = m.ckptStart, m.now
			if c.Epoch() != m.epoch {
				m.fatalf("Applied: epoch %d, want %d", c.Epoch(), m.epoch)
			}
		case "Aborted":
			m.stage = idle
			m.epochStart, m.lastEnd = m.now, m.now
			if c.Epoch() != m.epoch {
				m.fatalf("Aborted: epoch %d, want %d again", c.Epoch(), m.epoch)
			}
		case "TaskReady":
			m.ready[ev.task] = true
		case "SetTasks":
			m.tasks = ev.tasks
		}
	}

	switch act.Kind {
	case ActNone:
	case ActEndEpoch:
		if m.stage != idle {
			m.fatalf("%v while a checkpoint is in flight (stage %d)", act, m.stage)
		}
		m.barrier(act)
		if len(act.Tasks) == 0 || !slices.Equal(act.Tasks, m.tasks) {
			m.fatalf("%v: want the tasks %v", act, m.tasks)
		}
		m.stage = aligning
	case ActCommit:
		switch {
		case m.stage == idle && len(m.tasks) == 0:
			m.barrier(act) // no tasks: straight to the commit
		case m.stage == aligning && name == "TaskReady":
			for _, task := range m.asked {
				if !m.ready[task] {
					m.fatalf("%v while task %d is not ready", act, task)
				}
			}
		default:
			m.fatalf("%v after %s in stage %d", act, name, m.stage)
		}
		if !slices.Equal(act.Tasks, m.asked) {
			m.fatalf("%v: want the tasks of the barrier %v", act, m.asked)
		}
		m.stage = committing
	case ActApply:
		if name != "CommitDone" || m.stage != committing || act.Epoch != m.epoch {
			m.fatalf("%v after %s in stage %d (epoch %d)", act, name, m.stage, m.epoch)
		}
		m.stage = applying
	case ActAbort:
		var ce *CheckpointError
		if !errors.As(act.Err, &ce) || ce.Epoch != act.Epoch || ce.Reason != act.Reason {
			m.fatalf("%v: want a matching *CheckpointError", act)
		}
		switch act.Reason {
		case ReasonTimeout:
			if name != "Tick" || (m.stage != aligning && m.stage != committing) || m.now.Sub(m.ckptStart) <= m.cfg.Timeout {
				m.fatalf("%v at %v after the barrier (stage %d)", act, m.now.Sub(m.ckptStart), m.stage)
			}
		case ReasonCommitFailed, ReasonEpochFailed:
		default:
			m.fatalf("%v: unexpected reason", act)
		}
		m.failures++
		if m.failures > m.cfg.TolerableFailures || c.ConsecutiveFailures() != m.failures {
			m.fatalf("%v: %d failures (coordinator %d) with %d tolerated", act, m.failures, c.ConsecutiveFailures(), m.cfg.TolerableFailures)
		}
		m.dirty = false // rewound
		m.stage = aborting
	case ActFail:
		if act.Err == nil || c.Phase() != Failed || c.Err() != act.Err {
			m.fatalf("%v: phase %v, err %v", act, c.Phase(), c.Err())
		}
		if errors.Is(act.Err, ErrTooManyFailures) && m.failures+1 <= m.cfg.TolerableFailures {
			m.fatalf("%v with only %d failures before", act, m.failures)
		}
		if errors.Is(act.Err, ErrEpochOverflow) && act.Epoch != math.MaxUint64 {
			m.fatalf("%v", act)
		}
		m.failed, m.failErr = true, act.Err
		return
	default:
		m.fatalf("unknown action %v", act)
	}

	if m.done && !c.Done() {
		m.fatalf("left Done: phase %v", c.Phase())
	}
	if c.Done() {
		if !m.shut {
			m.fatalf("Done without a shutdown request")
		}
		if m.stage != idle || m.dirty {
			m.fatalf("Done with work left: stage %d, dirty %v", m.stage, m.dirty)
		}
		m.done = true
	}
	if want := map[stage]Phase{idle: Processing, aligning: Aligning, committing: Committing, applying: Applying, aborting: Aborting}[m.stage]; !m.done && c.Phase() != want {
		m.fatalf("phase %v, want %v", c.Phase(), want)
	}
}

// barrier records a new checkpoint and checks why it started.
func (m *model) barrier(act Action) {
	m.t.Helper()
	if act.Reason == ReasonInterval {
		if !m.dirty {
			m.fatalf("%v: an epoch without work ended on interval", act)
		}
		if m.now.Sub(m.epochStart) < m.cfg.Interval || m.now.Sub(m.lastEnd) < m.cfg.MinPause {
			m.fatalf("%v: %v into the epoch, %v after the last checkpoint", act, m.now.Sub(m.epochStart), m.now.Sub(m.lastEnd))
		}
	}
	if act.Reason == ReasonShutdown && !m.shut {
		m.fatalf("%v without a shutdown request", act)
	}
	m.asked = slices.Clone(m.tasks)
	clear(m.ready)
	m.ckptStart = m.now
	m.dirty = false
}
