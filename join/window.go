package join

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/window"
)

// WindowSpec declares a window join of two co-partitioned topics, Flink's
// window join (a.join(b).where(…).equalTo(…).window(…).apply(…)): a left
// record and a right record of the same key join when they fall in the
// same window, and each window emits its pairs when it fires. With CoGroup
// in place of Join it is Flink's coGroup, which gets both sides' records of
// the window and so also makes outer joins.
//
// It is a window job (package window) whose elements are the records of
// both topics, so it fires, takes late records and keeps its state as
// window jobs do (docs/windows.md).
type WindowSpec struct {
	// Name is the job's name, and the prefix of its state names: keep it
	// stable across releases, since it is the state's identity.
	Name string
	// Left and Right are the two input topics; the instance's
	// Options.InputTopics must be these two (co-partitioned), in any
	// order.
	Left, Right string
	// Assigner picks the windows and their clock: tumbling, sliding or
	// session windows, in event or processing time (a session takes
	// records of both sides, and sessions a record bridges merge).
	Assigner window.Assigner
	// Join makes the value of the output record of one pair of a window
	// that fires: every left record of the window with every right one,
	// the left ones in the order they came, each with the right ones in
	// the order they came (in a session that merged others, session by
	// session, as window.ProcessFunc gets them). The output is keyed by their key and stamped
	// with the window's last millisecond (window.Window.MaxTimestamp), as
	// Flink stamps it; a nil value emits nothing for the pair. An error
	// fails the window's firing as a window function's error does
	// (docs/windows.md#errors): none of its pairs is emitted. Set Join or
	// CoGroup, not both.
	Join func(key []byte, w window.Window, left, right Element) ([]byte, error)
	// CoGroup gets all the left and all the right records of a window that
	// fires, each side in the order they came (session by session in a
	// session that merged others), one of the two possibly
	// empty (never both), and emits any number of values, keyed and
	// stamped as Join's; a nil value emits nothing. An error fails the
	// firing as Join's does.
	CoGroup func(key []byte, w window.Window, left, right []Element, emit func(value []byte)) error
	// Timestamp gives a record's event time; required by event-time
	// assigners (sluice.KafkaTime takes the Kafka record time). It is
	// called twice a record (by the engine, and for the Element) and, as
	// every extractor, must answer the same each time. In processing time
	// an Element's Timestamp is its Kafka record time.
	Timestamp sluice.TimestampFunc
	// AllowedLateness keeps an event-time window this long past its end:
	// a record that comes after the window fired, but before the
	// watermark reaches its end + AllowedLateness, fires it again with
	// everything it holds, as window.Spec's does (so Join sees every pair
	// of the window again).
	AllowedLateness time.Duration
	// LateOutput, if set, is the side output that records too late for
	// every window they belong to go to, unchanged but for one more
	// header, sluice.HeaderTopic, naming the topic (the side) each came
	// from. Unset, they are dropped and counted (state <name>.late-dropped
	// per key, and LateDropped). Event time only.
	LateOutput sluice.OutputTag
	// LateDropped, if set, is incremented for each late record dropped
	// (committed or not: a replayed epoch counts again).
	LateDropped prometheus.Counter
	// EarlyInterval, EarlyCount and EarlyFailed fire windows before their
	// end, as window.Spec's (docs/windows.md#early-firings): each early
	// firing gets every pair of the window so far, so readers see pairs
	// again at each firing, the window's end included.
	EarlyInterval time.Duration
	EarlyCount    int
	EarlyFailed   prometheus.Counter
}

// Window returns the sluice.Job that runs the spec, or an error saying
// what is wrong with it. Its state is a window job's of the same name
// (docs/windows.md#state-and-timers), each record of either side an
// element of its windows: <name>.windows, <name>.elements and
// <name>.late-dropped (Job.States).
func Window(s WindowSpec) (sluice.Job, error) {
	if err := s.validate(); err != nil {
		return sluice.Job{}, fmt.Errorf("window join %q: %w", s.Name, err)
	}
	fn := s.CoGroup
	if s.Join != nil {
		fn = s.pairs
	}
	job, err := window.Job(window.Spec[sided, []byte]{
		Name:     s.Name,
		Assigner: s.Assigner,
		Function: window.Process(sidedCodec{}, func(ctx sluice.Context, w window.Window, elems []sided, emit func([]byte)) error {
			var left, right []Element
			for _, e := range elems {
				if e.left {
					left = append(left, e.Element)
				} else {
					right = append(right, e.Element)
				}
			}
			return fn(ctx.Key(), w, left, right, func(v []byte) {
				if v != nil {
					emit(v)
				}
			})
		}),
		Decode:          s.decode,
		Encode:          func(_ []byte, _ window.Window, v []byte) ([]byte, error) { return v, nil },
		Timestamp:       s.Timestamp,
		AllowedLateness: s.AllowedLateness,
		LateOutput:      s.LateOutput,
		LateDropped:     s.LateDropped,
		EarlyInterval:   s.EarlyInterval,
		EarlyCount:      s.EarlyCount,
		EarlyFailed:     s.EarlyFailed,
	})
	if err != nil {
		// One name: without window.Job's own prefix.
		msg, _ := strings.CutPrefix(err.Error(), fmt.Sprintf("window job %q: ", s.Name))
		return sluice.Job{}, fmt.Errorf("window join %q: %s", s.Name, msg)
	}
	// Join and CoGroup get no Context, so these are all its state: a
	// savepoint holding others is refused (Job.States).
	job.States = []string{s.Name + ".windows", s.Name + ".elements", s.Name + ".late-dropped"}
	// The engine took the record's event time with s.Timestamp before
	// Process: it is ctx.Timestamp() (the Kafka time in processing time).
	// The element takes it from there (decode) rather than calling
	// Timestamp, which may parse the value, a second time.
	process := job.Process
	job.Process = func(ctx sluice.Context, rec *sluice.Record) error {
		r := *rec
		r.Timestamp = ctx.Timestamp()
		return process(ctx, &r)
	}
	return job, nil
}

func (s WindowSpec) validate() error {
	if s.Name == "" {
		return errors.New("Name is empty")
	}
	if err := s.topics().check(); err != nil {
		return err
	}
	switch {
	case s.Join == nil && s.CoGroup == nil:
		return errors.New("Join and CoGroup are nil: set one")
	case s.Join != nil && s.CoGroup != nil:
		return errors.New("Join and CoGroup are both set: set one")
	case s.Assigner.Count():
		return errors.New("count windows are not for joins: a window join pairs records by time")
	}
	return nil
}

// pairs is CoGroup for Join: every left element with every right one.
func (s WindowSpec) pairs(key []byte, w window.Window, left, right []Element, emit func([]byte)) error {
	for _, l := range left {
		for _, r := range right {
			v, err := s.Join(key, w, l, r)
			if err != nil {
				return err
			}
			emit(v)
		}
	}
	return nil
}

func (s WindowSpec) topics() topics {
	return topics{"window join", s.Name, "Left", s.Left, "Right", s.Right, errNoKey}
}

// decode makes a record an element of its side; a record without a key is
// dead-lettered, as the interval join's (which records it would join is
// arbitrary).
func (s WindowSpec) decode(rec *sluice.Record) (sided, error) {
	left, err := s.topics().first(rec)
	if err != nil {
		return sided{}, err
	}
	// rec.Timestamp is the event time in event time (Window's Process).
	return sided{left: left, Element: Element{Value: rec.Value, Timestamp: rec.Timestamp, Partition: rec.Partition, Offset: rec.Offset}}, nil
}

// sided is a window's element: a record and its side.
type sided struct {
	left bool
	Element
}

// sidedCodec stores a sided element: 'L' or 'R', then the Element as
// elementCodec stores it (versioned). It is durable state: savepoints
// carry it.
type sidedCodec struct{}

func (sidedCodec) Encode(e sided) ([]byte, error) {
	side := byte('R')
	if e.left {
		side = 'L'
	}
	return elementCodec{}.AppendEncode([]byte{side}, e.Element)
}

func (sidedCodec) Decode(b []byte) (sided, error) {
	if len(b) == 0 || b[0] != 'L' && b[0] != 'R' {
		return sided{}, fmt.Errorf("join: a stored window element with side %q, want L or R", b[:min(len(b), 1)])
	}
	e, err := elementCodec{}.Decode(b[1:])
	return sided{left: b[0] == 'L', Element: e}, err
}
