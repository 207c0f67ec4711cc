package window

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

// Spec declares a window job: how records are decoded, which windows they
// fall in, what a window computes, and how its results are encoded.
type Spec[IN, OUT any] struct {
	// Name is the job's name, and the prefix of its state names: keep it
	// stable across releases, since it is the state's identity.
	Name string
	// Assigner picks the windows and their clock.
	Assigner Assigner
	// Function computes a window's results.
	Function Function[IN, OUT]
	// Decode turns an input record into an element. An error fails the
	// record as a ProcessFunc error does (dead-lettered; wrap it in a
	// sluice.DecodeError for the decode stage, or with sluice.Fatal to
	// stop the instance).
	Decode func(rec *sluice.Record) (IN, error)
	// Encode turns a result into the value of the output record, which is
	// emitted keyed by the window's key. An error fails the firing.
	Encode func(key []byte, w Window, out OUT) ([]byte, error)
	// Timestamp gives a record's event time; required by event-time
	// assigners (sluice.KafkaTime takes the Kafka record time), unused in
	// processing time, refused for count windows.
	Timestamp sluice.TimestampFunc
	// AllowedLateness keeps an event-time window this long past its end:
	// an element that comes after the window fired but before the
	// watermark reaches end + AllowedLateness updates it and fires it
	// again (a late firing). Default 0: a window is cleared when it
	// fires. Processing-time windows take none.
	AllowedLateness time.Duration
	// LateOutput, if set, is the side output that records too late for
	// every window they belong to go to, unchanged but for one more
	// header, sluice.HeaderTopic, naming the topic each came from (which
	// tells them apart in a job of several input topics). Unset, they are
	// dropped and counted (state <name>.late-dropped per key, and
	// LateDropped). Event time only.
	LateOutput sluice.OutputTag
	// EarlyInterval, if set, fires a window before its end with its
	// result so far, each time the assigner's clock (the watermark, or
	// the processing time) passes a multiple of EarlyInterval since the
	// Unix epoch while the window holds elements it has not fired with:
	// Flink's ContinuousEventTimeTrigger and
	// ContinuousProcessingTimeTrigger, but a window that did not change
	// since its last firing is not fired again. The firing at the
	// window's end stays, so readers see several results for a window,
	// the one at its end complete. Whole milliseconds. Windows that end
	// before 1970 do not fire early.
	EarlyInterval time.Duration
	// EarlyCount, if set, fires a window before its end with its result
	// so far each time an element brings its count to a multiple of
	// EarlyCount, right after that element (Flink's CountTrigger, with the
	// firing at the end kept). Sessions that merge add their counts, so a
	// merge can step over a multiple.
	EarlyCount int
	// SessionGap gives each element's session gap, for
	// DynamicEventTimeSession and DynamicProcessingTimeSession (required
	// there, refused elsewhere): the element's own window is [t,
	// t+SessionGap(element)). It must be deterministic (replays call it
	// again) and give at least 1ms (a fraction of a millisecond is
	// dropped); a gap below 1ms fails the record (dead-lettered).
	SessionGap func(in IN) time.Duration
	// LateDropped, if set, is incremented for each record dropped as too
	// late (committed or not: a replayed epoch counts again).
	LateDropped prometheus.Counter
	// EarlyFailed, if set, is incremented for each early firing (by
	// EarlyInterval or EarlyCount) whose window function or Encode failed
	// (committed or not). Such a firing emits nothing and fails nothing
	// else: the window keeps its elements and fires at its end, where an
	// error that persists is dead-lettered as any firing's. (What the
	// function writes through its Context itself, keyed state or
	// ctx.Emit, stays.) sluice.Fatal stops the instance, as anywhere.
	EarlyFailed prometheus.Counter
}

// Job returns the sluice.Job that runs the spec, or an error saying what is
// wrong with it.
func Job[IN, OUT any](s Spec[IN, OUT]) (sluice.Job, error) {
	if err := s.validate(); err != nil {
		return sluice.Job{}, fmt.Errorf("window job %q: %w", s.Name, err)
	}
	o := newOperator(s)
	job := sluice.Job{
		Name:    s.Name,
		Emits:   true,
		Process: o.process,
	}
	if !s.Assigner.counting() {
		job.OnTimer = o.onTimer
	}
	if s.Assigner.EventTime() {
		job.EventTime = true
		job.Timestamp = s.Timestamp
	}
	if s.LateOutput != "" {
		job.SideOutputs = []sluice.OutputTag{s.LateOutput}
	}
	return job, job.Validate()
}

func (s Spec[IN, OUT]) validate() error {
	if s.Name == "" {
		return errors.New("Name is empty")
	}
	if err := s.Assigner.validate(); err != nil {
		return err
	}
	if err := s.Function.validate(s.Assigner.merging()); err != nil {
		return err
	}
	if s.Assigner.counting() {
		return s.validateCount()
	}
	switch {
	case s.Assigner.dynamic && s.SessionGap == nil:
		return errors.New("dynamic sessions need SessionGap, each element's gap")
	case !s.Assigner.dynamic && s.SessionGap != nil:
		return errors.New("SessionGap is for DynamicEventTimeSession and DynamicProcessingTimeSession")
	}
	switch {
	case s.Decode == nil:
		return errors.New("Decode is nil")
	case s.Encode == nil:
		return errors.New("Encode is nil")
	case s.AllowedLateness < 0:
		return fmt.Errorf("AllowedLateness %s: want 0 or more", s.AllowedLateness)
	case s.EarlyInterval < 0 || s.EarlyInterval%time.Millisecond != 0:
		return fmt.Errorf("EarlyInterval %s: want 0 (none) or whole milliseconds", s.EarlyInterval)
	case s.EarlyCount < 0:
		return fmt.Errorf("EarlyCount %d: want 0 (none) or more", s.EarlyCount)
	case s.Assigner.EventTime() && s.Timestamp == nil:
		return errors.New("event-time windows need a Timestamp extractor (sluice.KafkaTime takes the Kafka record time)")
	case !s.Assigner.EventTime() && s.AllowedLateness > 0:
		return errors.New("AllowedLateness is for event time: a processing-time window has no late records")
	case !s.Assigner.EventTime() && s.LateOutput != "":
		return errors.New("LateOutput is for event time: a processing-time window has no late records")
	}
	return nil
}

// validateCount checks a spec of count windows, which keep no clock: what
// is about time does not apply to them.
func (s Spec[IN, OUT]) validateCount() error {
	const why = "count windows fire by count, on no clock"
	switch {
	case s.Decode == nil:
		return errors.New("Decode is nil")
	case s.Encode == nil:
		return errors.New("Encode is nil")
	case s.Timestamp != nil:
		return errors.New("Timestamp is for event-time windows: " + why + " (a count window's Window spans its records' Kafka times)")
	case s.SessionGap != nil:
		return errors.New("SessionGap is for dynamic sessions, not count windows")
	case s.AllowedLateness != 0, s.LateOutput != "", s.LateDropped != nil:
		return errors.New("AllowedLateness, LateOutput and LateDropped are for event-time windows: " + why + ", and no record is late")
	case s.EarlyInterval != 0, s.EarlyCount != 0, s.EarlyFailed != nil:
		return errors.New("EarlyInterval, EarlyCount and EarlyFailed are for windows of time: " + why + " already")
	}
	return nil
}
