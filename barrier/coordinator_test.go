package barrier

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

func testConfig() Config {
	return Config{Interval: 100 * time.Millisecond, Timeout: time.Second, TolerableFailures: 5}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none means valid
	}{
		{"valid", testConfig(), nil},
		{"zero min pause and tolerance", Config{Interval: 1, Timeout: 1}, nil},
		{"zero interval", Config{Timeout: time.Second}, []string{"Config.Interval is 0s; it must be positive"}},
		{"negative interval", Config{Interval: -time.Second, Timeout: time.Second}, []string{"Config.Interval is -1s"}},
		{"zero timeout", Config{Interval: time.Second}, []string{"Config.Timeout is 0s; it must be positive"}},
		{"negative min pause", Config{Interval: time.Second, Timeout: time.Second, MinPause: -1}, []string{"Config.MinPause is -1ns; it must not be negative"}},
		{"negative tolerance", Config{Interval: time.Second, Timeout: time.Second, TolerableFailures: -1}, []string{"Config.TolerableFailures is -1; it must not be negative"}},
		{"all wrong", Config{MinPause: -1, TolerableFailures: -3}, []string{"Config.Interval", "Config.Timeout", "Config.MinPause", "Config.TolerableFailures is -3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestNewPanicsOnInvalidConfig(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(error).Error(), "Config.Interval") {
			t.Fatalf("recover() = %v, want the Validate error", r)
		}
	}()
	New(Config{Timeout: time.Second}, t0, 1)
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{ActNone.String(), "none"},
		{ActEndEpoch.String(), "end-epoch"},
		{ActCommit.String(), "commit"},
		{ActApply.String(), "apply"},
		{ActAbort.String(), "abort"},
		{ActFail.String(), "fail"},
		{ActionKind(99).String(), "ActionKind(99)"},
		{ActionKind(-1).String(), "ActionKind(-1)"},
		{Processing.String(), "processing"},
		{Aligning.String(), "aligning"},
		{Committing.String(), "committing"},
		{Applying.String(), "applying"},
		{Aborting.String(), "aborting"},
		{Failed.String(), "failed"},
		{Done.String(), "done"},
		{Phase(42).String(), "Phase(42)"},
		{ReasonNone.String(), "none"},
		{ReasonInterval.String(), "interval"},
		{ReasonSavepoint.String(), "savepoint"},
		{ReasonShutdown.String(), "shutdown"},
		{ReasonRevoke.String(), "revoke"},
		{ReasonTimeout.String(), "timeout"},
		{ReasonCommitFailed.String(), "commit-failed"},
		{ReasonEpochFailed.String(), "epoch-failed"},
		{ReasonApplyFailed.String(), "apply-failed"},
		{ReasonIllegalEvent.String(), "illegal-event"},
		{ReasonEpochOverflow.String(), "epoch-overflow"},
		{Reason(77).String(), "Reason(77)"},
		{Action{}.String(), "none"},
		{Action{Kind: ActEndEpoch, Epoch: 7, Tasks: []int32{0, 3}, Reason: ReasonInterval}.String(), "end-epoch epoch=7 tasks=0,3 reason=interval"},
		{Action{Kind: ActCommit, Epoch: 1, Reason: ReasonSavepoint}.String(), "commit epoch=1 tasks=- reason=savepoint"},
		{Action{Kind: ActFail, Epoch: 2, Reason: ReasonApplyFailed, Err: errors.New("disk")}.String(), `fail epoch=2 reason=apply-failed err="disk"`},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestErrors(t *testing.T) {
	cause := errors.New("fenced")
	ce := &CheckpointError{Epoch: 3, Trigger: ReasonSavepoint, Reason: ReasonCommitFailed, Cause: cause}
	if !errors.Is(ce, cause) {
		t.Error("CheckpointError does not unwrap to its cause")
	}
	if got, want := ce.Error(), "barrier: checkpoint of epoch 3 (savepoint) failed (commit-failed): fenced"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	ee := &EventError{Event: "CommitDone", Phase: Processing, Epoch: 4, Detail: "no commit was asked for"}
	if !errors.Is(ee, ErrIllegalEvent) {
		t.Error("EventError is not ErrIllegalEvent")
	}
	if got, want := ee.Error(), "barrier: illegal event CommitDone while processing in epoch 4: no commit was asked for"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// driveTo takes a fresh coordinator (tasks {0}) into phase.
func driveTo(c *Coordinator, phase Phase, now time.Time) {
	switch phase {
	case Processing:
		c.SetTasks([]int32{0})
		c.Work(now)
	case Aligning:
		c.SetTasks([]int32{0})
		c.RequestSavepoint(now)
	case Committing:
		driveTo(c, Aligning, now)
		c.TaskReady(0, now)
	case Applying:
		driveTo(c, Committing, now)
		c.CommitDone(now)
	case Aborting:
		driveTo(c, Committing, now)
		c.CommitFailed(errors.New("boom"), now)
	case Failed:
		c.CommitDone(now)
	case Done:
		c.SetTasks([]int32{0})
		c.RequestShutdown(now)
	}
}

// TestEventPhaseMatrix sends every event in every phase: an event outside
// the phases that allow it is an illegal event, and in Failed every event
// gets the first failure again.
func TestEventPhaseMatrix(t *testing.T) {
	boom := errors.New("boom")
	all := []Phase{Processing, Aligning, Committing, Applying, Aborting, Done}
	events := []struct {
		name  string
		send  func(c *Coordinator, now time.Time) Action
		legal []Phase
	}{
		{"Tick", func(c *Coordinator, now time.Time) Action { return c.Tick(now) }, all},
		{"Work", func(c *Coordinator, now time.Time) Action { return c.Work(now) }, []Phase{Processing, Aligning, Committing, Applying}},
		{"SetTasks", func(c *Coordinator, now time.Time) Action { return c.SetTasks([]int32{0, 1}) }, []Phase{Processing}},
		{"TaskReady", func(c *Coordinator, now time.Time) Action { return c.TaskReady(0, now) }, []Phase{Aligning}},
		{"CommitDone", func(c *Coordinator, now time.Time) Action { return c.CommitDone(now) }, []Phase{Committing}},
		{"CommitFailed", func(c *Coordinator, now time.Time) Action { return c.CommitFailed(boom, now) }, []Phase{Committing}},
		{"EpochFailed", func(c *Coordinator, now time.Time) Action { return c.EpochFailed(boom, now) }, []Phase{Processing, Aligning, Committing}},
		{"Applied", func(c *Coordinator, now time.Time) Action { return c.Applied(now) }, []Phase{Applying}},
		{"ApplyFailed", func(c *Coordinator, now time.Time) Action { return c.ApplyFailed(boom, now) }, []Phase{Applying}},
		{"Aborted", func(c *Coordinator, now time.Time) Action { return c.Aborted(now) }, []Phase{Aborting}},
		{"RequestSavepoint", func(c *Coordinator, now time.Time) Action { return c.RequestSavepoint(now) }, []Phase{Processing, Aligning, Committing, Applying, Aborting}},
		{"RequestShutdown", func(c *Coordinator, now time.Time) Action { return c.RequestShutdown(now) }, all},
		{"RequestRevoke", func(c *Coordinator, now time.Time) Action { return c.RequestRevoke(now) }, all},
	}
	for _, ev := range events {
		for _, phase := range append(all, Failed) {
			t.Run(ev.name+"/"+phase.String(), func(t *testing.T) {
				c := New(testConfig(), t0, 1)
				driveTo(c, phase, t0)
				if c.Phase() != phase {
					t.Fatalf("setup reached %v, want %v", c.Phase(), phase)
				}
				firstErr := c.Err()
				act := ev.send(c, t0)

				if phase == Failed {
					if act.Kind != ActFail || act.Err != firstErr || c.Phase() != Failed {
						t.Fatalf("%s in failed = %v (phase %v), want the first failure %v again", ev.name, act, c.Phase(), firstErr)
					}
					return
				}
				var ee *EventError
				illegal := errors.As(act.Err, &ee)
				legal := false
				for _, p := range ev.legal {
					legal = legal || p == phase
				}
				if legal && illegal {
					t.Fatalf("%s in %v = %v, want it accepted", ev.name, phase, act)
				}
				if !legal {
					if act.Kind != ActFail || !illegal || ee.Event != ev.name || ee.Phase != phase {
						t.Fatalf("%s in %v = %v, want an illegal-event failure naming %s and %v", ev.name, phase, act, ev.name, phase)
					}
					if act.Reason != ReasonIllegalEvent || c.Phase() != Failed || c.Err() != act.Err {
						t.Fatalf("after %v: phase %v, err %v", act, c.Phase(), c.Err())
					}
				}
			})
		}
	}
}

// TestNilErrors: failure reports without an error are caller bugs.
func TestNilErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase Phase
		send  func(c *Coordinator) Action
	}{
		{"CommitFailed", Committing, func(c *Coordinator) Action { return c.CommitFailed(nil, t0) }},
		{"EpochFailed", Processing, func(c *Coordinator) Action { return c.EpochFailed(nil, t0) }},
		{"ApplyFailed", Applying, func(c *Coordinator) Action { return c.ApplyFailed(nil, t0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(testConfig(), t0, 1)
			driveTo(c, tc.phase, t0)
			if act := tc.send(c); act.Kind != ActFail || !errors.Is(act.Err, ErrIllegalEvent) || !strings.Contains(act.Err.Error(), "nil error") {
				t.Fatalf("got %v, want an illegal-event failure for the nil error", act)
			}
		})
	}
}

// TestTasksAreCopies: the coordinator keeps no slice it was given or handed
// out, so a caller that reuses one cannot change a checkpoint.
func TestTasksAreCopies(t *testing.T) {
	c := New(testConfig(), t0, 1)
	in := []int32{2, 0, 1}
	c.SetTasks(in)
	in[0] = 9
	got := c.Tasks()
	got[0] = 8
	c.Work(t0)
	act := c.Tick(t0.Add(time.Second))
	if act.Kind != ActEndEpoch || formatTasks(act.Tasks) != "0,1,2" {
		t.Fatalf("got %v, want end-epoch with tasks 0,1,2", act)
	}
	act.Tasks[0] = 7
	for _, task := range []int32{0, 1} {
		if a := c.TaskReady(task, t0); a.Kind != ActNone {
			t.Fatalf("TaskReady(%d) = %v", task, a)
		}
	}
	if a := c.TaskReady(2, t0); a.Kind != ActCommit || formatTasks(a.Tasks) != "0,1,2" {
		t.Fatalf("got %v, want commit with tasks 0,1,2", a)
	}
}

// TestIntervalBoundaries checks the due rule at and around its edges.
func TestIntervalBoundaries(t *testing.T) {
	for _, tc := range []struct {
		name     string
		minPause time.Duration
		work     bool
		after    time.Duration
		want     ActionKind
	}{
		{"before interval", 0, true, 99 * time.Millisecond, ActNone},
		{"at interval", 0, true, 100 * time.Millisecond, ActEndEpoch},
		{"long after", 0, true, time.Hour, ActEndEpoch},
		{"no work", 0, false, time.Hour, ActNone},
		{"pause not over", 150 * time.Millisecond, true, 149 * time.Millisecond, ActNone},
		{"pause over", 150 * time.Millisecond, true, 150 * time.Millisecond, ActEndEpoch},
		{"clock behind", 0, true, -time.Second, ActNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MinPause = tc.minPause
			c := New(cfg, t0, 1)
			c.SetTasks([]int32{0})
			if tc.work {
				c.Work(t0)
			}
			if got := c.Tick(t0.Add(tc.after)); got.Kind != tc.want {
				t.Fatalf("Tick(+%v) = %v, want %v", tc.after, got, tc.want)
			}
		})
	}
}

func TestFirstEpoch(t *testing.T) {
	for _, first := range []uint64{0, 1, 41, math.MaxUint64 - 1} {
		c := New(testConfig(), t0, first)
		c.SetTasks([]int32{0})
		c.Work(t0)
		for _, step := range []func() Action{
			func() Action { return c.Tick(t0.Add(time.Second)) },
			func() Action { return c.TaskReady(0, t0) },
			func() Action { return c.CommitDone(t0) },
		} {
			if act := step(); act.Epoch != first {
				t.Fatalf("first epoch %d: got %v", first, act)
			}
		}
		c.Applied(t0)
		if c.Epoch() != first+1 {
			t.Fatalf("after applying %d: epoch %d", first, c.Epoch())
		}
	}
}

// Due is when Tick would place the barrier: never without work or outside
// Processing, the interval after the epoch began, or the end of MinPause
// if that is later; a Tick at Due ends the epoch and one just before does
// not.
func TestDueIsWhenTickEndsTheEpoch(t *testing.T) {
	cfg := testConfig()
	cfg.MinPause = 30 * time.Millisecond
	c := New(cfg, t0, 1)
	c.SetTasks([]int32{0})
	if _, ok := c.Due(); ok {
		t.Fatal("Due without work: want none")
	}
	c.Work(t0.Add(10 * time.Millisecond))
	due, ok := c.Due()
	if !ok || !due.Equal(t0.Add(cfg.Interval)) {
		t.Fatalf("Due = %v, %v; want the interval after the epoch began (%v)", due, ok, t0.Add(cfg.Interval))
	}
	if act := c.Tick(due.Add(-time.Nanosecond)); act.Kind != ActNone {
		t.Fatalf("Tick before Due = %v, want none", act)
	}
	act := c.Tick(due)
	if act.Kind != ActEndEpoch {
		t.Fatalf("Tick at Due = %v, want ActEndEpoch", act)
	}
	if _, ok := c.Due(); ok {
		t.Fatal("Due while aligning: want none")
	}
	// The checkpoint ends late, so MinPause, not the interval, decides
	// when the next epoch is due.
	c.TaskReady(0, due)
	c.CommitDone(due.Add(80 * time.Millisecond))
	end := due.Add(90 * time.Millisecond)
	c.Applied(end)
	c.Work(end)
	next, ok := c.Due()
	if want := end.Add(cfg.MinPause); !ok || !next.Equal(want) {
		t.Fatalf("Due after a late checkpoint = %v, %v; want MinPause after it (%v)", next, ok, want)
	}
	if act := c.Tick(next.Add(-time.Nanosecond)); act.Kind != ActNone {
		t.Fatalf("Tick before Due = %v, want none", act)
	}
	if act := c.Tick(next); act.Kind != ActEndEpoch {
		t.Fatalf("Tick at Due = %v, want ActEndEpoch", act)
	}
}
