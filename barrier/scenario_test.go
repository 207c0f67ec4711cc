package barrier

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestScenarios runs every testdata/*.txt script. A script is one command a
// line ('#' starts a comment):
//
//	config interval=100ms timeout=1s min-pause=0s tolerable=0 epoch=1
//	                          before any event; these are the defaults
//	advance DUR               move the fake clock
//	tick [DUR]                move the clock by DUR (default 0), then Tick
//	work                      Work
//	tasks 0,1,2 | tasks -     SetTasks
//	ready N                   TaskReady(N)
//	commit-ok                 CommitDone
//	commit-fail MSG           CommitFailed(errors.New(MSG))
//	epoch-fail MSG            EpochFailed(errors.New(MSG))
//	apply-fail MSG            ApplyFailed(errors.New(MSG))
//	applied | aborted         Applied | Aborted
//	savepoint | shutdown | revoke
//	                          RequestSavepoint | RequestShutdown | RequestRevoke
//	expect KIND [epoch=N] [tasks=0,1|-] [reason=R] [is=SENTINEL] [err=TEXT...]
//	                          the action of the event just before; err= takes
//	                          the rest of the line and is matched as a substring
//	state [phase=P] [epoch=N] [failures=N] [done=BOOL] [tasks=0,1|-]
//
// An event that is not followed by an expect must return ActNone.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no scenarios in testdata")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			runScenario(t, file)
		})
	}
}

var scenarioSentinels = map[string]error{
	"illegal-event":     ErrIllegalEvent,
	"timeout":           ErrTimeout,
	"too-many-failures": ErrTooManyFailures,
	"apply-failed":      ErrApplyFailed,
	"epoch-overflow":    ErrEpochOverflow,
}

type scenario struct {
	t    *testing.T
	file string
	line int

	cfg   Config
	first uint64
	now   time.Time
	c     *Coordinator

	last     Action // the action of the last event, until an expect reads it
	lastLine int    // its line, 0 once read
	lastCmd  string
}

func runScenario(t *testing.T, file string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := &scenario{
		t:     t,
		file:  file,
		cfg:   Config{Interval: 100 * time.Millisecond, Timeout: time.Second},
		first: 1,
		now:   time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		s.line++
		text := sc.Text()
		if i := strings.Index(text, "#"); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		s.command(fields[0], fields[1:], strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), fields[0])))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	s.line++
	s.settle()
}

func (s *scenario) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("%s:%d: %s", s.file, s.line, fmt.Sprintf(format, args...))
}

// settle checks that an action nobody expected is ActNone.
func (s *scenario) settle() {
	s.t.Helper()
	if s.lastLine != 0 && s.last.Kind != ActNone {
		s.t.Fatalf("%s:%d: %s returned %v, and no expect follows", s.file, s.lastLine, s.lastCmd, s.last)
	}
	s.lastLine = 0
}

func (s *scenario) coordinator() *Coordinator {
	if s.c == nil {
		if err := s.cfg.Validate(); err != nil {
			s.fatalf("config: %v", err)
		}
		s.c = New(s.cfg, s.now, s.first)
	}
	return s.c
}

func (s *scenario) duration(arg string) time.Duration {
	d, err := time.ParseDuration(arg)
	if err != nil {
		s.fatalf("%v", err)
	}
	return d
}

func (s *scenario) command(cmd string, args []string, rest string) {
	s.t.Helper()
	switch cmd {
	case "config":
		if s.c != nil {
			s.fatalf("config after the first event")
		}
		for k, v := range s.pairs(args) {
			switch k {
			case "interval":
				s.cfg.Interval = s.duration(v)
			case "timeout":
				s.cfg.Timeout = s.duration(v)
			case "min-pause":
				s.cfg.MinPause = s.duration(v)
			case "tolerable":
				s.cfg.TolerableFailures = s.atoi(v)
			case "epoch":
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					s.fatalf("%v", err)
				}
				s.first = n
			default:
				s.fatalf("unknown config key %q", k)
			}
		}
		return
	case "advance":
		s.now = s.now.Add(s.duration(rest))
		return
	case "expect":
		s.expect(args, rest)
		return
	case "state":
		s.state(args)
		return
	}

	s.settle()
	c := s.coordinator()
	var act Action
	switch cmd {
	case "tick":
		if rest != "" {
			s.now = s.now.Add(s.duration(rest))
		}
		act = c.Tick(s.now)
	case "work":
		act = c.Work(s.now)
	case "tasks":
		act = c.SetTasks(s.tasks(rest))
	case "ready":
		act = c.TaskReady(int32(s.atoi(rest)), s.now)
	case "commit-ok":
		act = c.CommitDone(s.now)
	case "commit-refused":
		act = c.CommitRefused(errors.New(rest), s.now)
	case "commit-fail":
		act = c.CommitFailed(errors.New(rest), s.now)
	case "epoch-fail":
		act = c.EpochFailed(errors.New(rest), s.now)
	case "apply-fail":
		act = c.ApplyFailed(errors.New(rest), s.now)
	case "applied":
		act = c.Applied(s.now)
	case "aborted":
		act = c.Aborted(s.now)
	case "savepoint":
		act = c.RequestSavepoint(s.now)
	case "shutdown":
		act = c.RequestShutdown(s.now)
	case "revoke":
		act = c.RequestRevoke(s.now)
	case "checkpoint":
		act = c.RequestCheckpoint(s.now)
	default:
		s.fatalf("unknown command %q", cmd)
	}
	s.last, s.lastLine, s.lastCmd = act, s.line, cmd
}

func (s *scenario) expect(args []string, rest string) {
	s.t.Helper()
	if s.lastLine == 0 {
		s.fatalf("expect without an event before it")
	}
	s.lastLine = 0
	if len(args) == 0 {
		s.fatalf("expect needs a kind")
	}
	got := s.last
	if got.Kind.String() != args[0] {
		s.fatalf("got %v, want kind %s", got, args[0])
	}
	var wantErr string
	if i := strings.Index(rest, "err="); i >= 0 {
		wantErr = rest[i+len("err="):]
		args = strings.Fields(rest[:i])
	}
	for k, v := range s.pairs(args[1:]) {
		var have string
		switch k {
		case "epoch":
			have = strconv.FormatUint(got.Epoch, 10)
		case "tasks":
			have = formatTasks(got.Tasks)
		case "reason":
			have = got.Reason.String()
		case "is":
			target, ok := scenarioSentinels[v]
			if !ok {
				s.fatalf("unknown sentinel %q", v)
			}
			if !errors.Is(got.Err, target) {
				s.fatalf("got %v, want an error that is %s", got, v)
			}
			continue
		default:
			s.fatalf("unknown expect key %q", k)
		}
		if have != v {
			s.fatalf("got %v, want %s=%s", got, k, v)
		}
	}
	if wantErr != "" && (got.Err == nil || !strings.Contains(got.Err.Error(), wantErr)) {
		s.fatalf("got %v, want err containing %q", got, wantErr)
	}
	if (got.Kind == ActAbort || got.Kind == ActFail) != (got.Err != nil) {
		s.fatalf("got %v: Err must be set exactly for abort and fail", got)
	}
}

func (s *scenario) state(args []string) {
	s.t.Helper()
	s.settle()
	c := s.coordinator()
	for k, v := range s.pairs(args) {
		var have string
		switch k {
		case "phase":
			have = c.Phase().String()
		case "epoch":
			have = strconv.FormatUint(c.Epoch(), 10)
		case "failures":
			have = strconv.Itoa(c.ConsecutiveFailures())
		case "done":
			have = strconv.FormatBool(c.Done())
		case "tasks":
			have = formatTasks(c.Tasks())
		default:
			s.fatalf("unknown state key %q", k)
		}
		if have != v {
			s.fatalf("state %s is %s, want %s", k, have, v)
		}
	}
}

func (s *scenario) pairs(args []string) map[string]string {
	m := make(map[string]string, len(args))
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			s.fatalf("want key=value, got %q", a)
		}
		m[k] = v
	}
	return m
}

func (s *scenario) atoi(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		s.fatalf("%v", err)
	}
	return n
}

func (s *scenario) tasks(v string) []int32 {
	if v == "-" {
		return []int32{}
	}
	var tasks []int32
	for _, f := range strings.Split(v, ",") {
		tasks = append(tasks, int32(s.atoi(strings.TrimSpace(f))))
	}
	return tasks
}
