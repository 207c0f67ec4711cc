package function

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	functionv1 "github.com/sluicehq/sluice/function/functionv1"
	"github.com/sluicehq/sluice/function/functionv1/functionv1connect"
	"github.com/sluicehq/sluice/kstate"
)

// JobName is the name of the function job (logs, metrics, dead-letter
// headers, savepoints).
const JobName = "function"

// New asks the function at o.URL to describe itself, waiting while it
// cannot be reached, and returns the job that runs it. A *DescribeError
// says the function cannot run with this processor. The job's States and
// SideOutputs are the function's declarations; bind the side outputs in
// sluice.Options.SideOutputTopics. Its Close unregisters the job's metrics
// from o.Registry; sluice.Instance.Close calls it.
func New(ctx context.Context, o Options) (sluice.Job, error) {
	o = o.withDefaults()
	if err := o.validate(); err != nil {
		return sluice.Job{}, err
	}
	client, idle, err := newClient(o)
	if err != nil {
		return sluice.Job{}, err
	}
	spec, err := describe(ctx, o, client)
	if err != nil {
		idle()
		return sluice.Job{}, err
	}
	f, err := newFn(o, client, spec)
	if err != nil {
		idle()
		return sluice.Job{}, err
	}
	f.idle = idle
	job := sluice.Job{
		Name:     JobName,
		Emits:    true,
		Prefetch: f.prefetch,
		Process:  f.process,
		OnTimer:  f.onTimer,
		Close:    f.close,
		// A state is the function's bytes: JSON as it is, other bytes as
		// a base64 string.
		QueryState: f.queryState,
	}
	if spec.EventTime {
		// The records' Kafka times, or where the function said they are:
		// a function in another language cannot be asked for each
		// record's time before its batch.
		job.EventTime, job.Timestamp = true, sluice.KafkaTime
		if spec.eventTime != nil {
			job.Timestamp = f.timestamp
		}
	}
	for _, st := range spec.States {
		job.States = append(job.States, st.Name)
	}
	for _, tag := range spec.SideOutputs {
		job.SideOutputs = append(job.SideOutputs, sluice.OutputTag(tag))
	}
	return job, nil
}

// fn is the function job's state. Prefetch and Process run on the engine's
// loop goroutine (one at a time); only the calls run concurrently, and they
// touch neither the store nor batches.
type fn struct {
	o      Options
	client functionv1connect.FunctionServiceClient
	m      *metrics
	states []*kstate.ValueState[[]byte]
	index  map[string]int // state name → states
	tags   map[string]bool
	// batches are each task's answers for its current batch, replaced by
	// every Prefetch of the task.
	batches map[int32]map[recordID]*recordPlan
	idle    func() // closes the client's idle connections
	closed  atomic.Bool
	// eventTime: the function declared event_time.
	eventTime bool
	// timeSource is where its records' event time is; nil: their Kafka
	// timestamps.
	timeSource *eventTimeSource
}

// errClosed is what a closed job answers when run again: its metrics are
// off their registry, so it would run unseen.
var errClosed = errors.New("function: the job was closed (Instance.Close): build a new one with function.New")

// close is the Job's Close: it unregisters the metrics and closes the
// idle connections to the function, the first time; the job refuses to
// run after it.
func (f *fn) close() error {
	if f.closed.Swap(true) {
		return nil
	}
	f.idle()
	return f.m.unregister()
}

type recordID struct {
	topic  string
	offset int64
}

// recordPlan is what Process does for one record: apply the key's result
// at its applyAt, fail every record of a failed key and each record a
// PARTIAL result lists, nothing else.
type recordPlan struct {
	key   *keyCall
	index int // in key.events
	// eventTime is the record's time as the function's eventTimeSource
	// read it in Prefetch, for timestamp.
	eventTime time.Time
}

// timestamp is the Job's Timestamp when the function says where its event
// time is: the time Prefetch read for the record, which the engine calls
// it for next (on the same goroutine; a task's number is its input
// partition's), rather than reading the value again. A record Prefetch
// left out has no plan: its time is read here, and fails again.
func (f *fn) timestamp(rec *sluice.Record) (time.Time, error) {
	if p := f.batches[rec.Partition][recordID{rec.Topic, rec.Offset}]; p != nil {
		return p.eventTime, nil
	}
	return f.timeSource.timestamp(rec)
}

func newFn(o Options, client functionv1connect.FunctionServiceClient, spec Spec) (*fn, error) {
	m, err := newMetrics(o.Registry)
	if err != nil {
		return nil, err
	}
	f := &fn{o: o, client: client, m: m, index: map[string]int{}, tags: map[string]bool{}, batches: map[int32]map[recordID]*recordPlan{}, eventTime: spec.EventTime, timeSource: spec.eventTime}
	for i, st := range spec.States {
		var opts []kstate.Option
		if st.TTL > 0 {
			opts = append(opts, kstate.WithTTL(max(st.TTL, time.Millisecond), kstate.OnCreateAndWrite))
		}
		f.states = append(f.states, kstate.Value[[]byte](st.Name, kstate.Bytes(), opts...))
		f.index[st.Name] = i
	}
	for _, tag := range spec.SideOutputs {
		f.tags[tag] = true
	}
	return f, nil
}

// queryState is the job's sluice.Job.QueryState: the bytes of the
// declared state named state, as JSON when they are JSON.
func (f *fn) queryState(s kstate.Scope, state string) (any, bool, error) {
	i, ok := f.index[state]
	if !ok {
		return nil, false, fmt.Errorf("function: no state %q declared", state)
	}
	b, ok, err := f.states[i].Get(s)
	if !ok || err != nil {
		return nil, ok, err
	}
	if json.Valid(b) {
		return json.RawMessage(b), true, nil
	}
	return b, true, nil
}

// keyScope is read access to one key's state outside a record's Context.
type keyScope struct {
	st  *kstate.Store
	key []byte
	now time.Time
}

func (s keyScope) Store() *kstate.Store { return s.st }
func (s keyScope) Key() []byte          { return s.key }
func (s keyScope) Now() time.Time       { return s.now }

// readStates returns the key's current value of every declared state,
// leaving out those unset.
func (f *fn) readStates(s kstate.Scope) ([]*functionv1.State, error) {
	var out []*functionv1.State
	for _, st := range f.states {
		v, ok, err := st.Get(s)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, &functionv1.State{Name: st.Name(), Value: v})
		}
	}
	return out, nil
}

// prefetch calls the function for the batch's keys and keeps the answers
// for process.
func (f *fn) prefetch(pc sluice.PrefetchContext, recs []*sluice.Record) error {
	if f.closed.Load() {
		return errClosed
	}
	var keys []*keyCall
	byKey := map[string]*keyCall{}
	plans := make(map[recordID]*recordPlan, len(recs))
	for _, r := range recs {
		var eventTime *int64
		var at time.Time
		if src := f.timeSource; src != nil {
			var err error
			if at, err = src.timestamp(r); err != nil {
				// The engine dead-letters it at its Timestamp, the same
				// call, before Process: the function never sees it, and
				// the key's answer is applied at its last record that
				// has a time.
				continue
			}
			ms := at.UnixMilli()
			eventTime = &ms
		}
		k := byKey[string(r.Key)]
		if k == nil {
			k = &keyCall{key: r.Key}
			byKey[string(r.Key)] = k
			keys = append(keys, k)
		}
		id := recordID{r.Topic, r.Offset}
		plans[id] = &recordPlan{key: k, index: len(k.events), eventTime: at}
		k.events = append(k.events, recordEvent(r, eventTime))
	}
	for _, k := range keys {
		states, err := f.readStates(keyScope{pc.Store(), k.key, pc.Now()})
		if err != nil {
			return fmt.Errorf("function: key %q: read state: %w", k.key, err)
		}
		k.states = states
	}
	if err := f.run(pc.Context(), pc.Task(), callTime{pc.Now(), pc.CurrentWatermark()}, keys); err != nil {
		return err
	}
	for _, k := range keys {
		k.setApplyAt()
	}
	f.batches[pc.Task()] = plans
	return nil
}

// process applies the answer of the record's key at its last record.
func (f *fn) process(ctx sluice.Context, rec *sluice.Record) error {
	p := f.batches[ctx.Task()][recordID{rec.Topic, rec.Offset}]
	if p == nil {
		// The engine calls Prefetch before the batch's records.
		return sluice.Fatal(fmt.Errorf("function: task %d offset %d was not prefetched", ctx.Task(), rec.Offset))
	}
	if p.key.err != nil {
		return f.failure(p.key.key, p.key.err)
	}
	if reason, failed := p.key.failed[p.index]; failed {
		return f.failure(p.key.key, failedErr(reason))
	}
	if p.index != p.key.applyAt {
		return nil
	}
	return f.apply(ctx, p.key.result)
}

// onTimer makes one call for the timer's key and applies its answer.
func (f *fn) onTimer(ctx sluice.Context, t sluice.Timer) error {
	if f.closed.Load() {
		return sluice.Fatal(errClosed)
	}
	domain := functionv1.TimeDomain_PROCESSING_TIME
	if t.Domain == sluice.EventTime {
		domain = functionv1.TimeDomain_EVENT_TIME
	}
	states, err := f.readStates(ctx)
	if err != nil {
		return err
	}
	k := &keyCall{key: t.Key, states: states, events: []*functionv1.Event{{Event: &functionv1.Event_Timer{Timer: &functionv1.Timer{AtMs: t.At.UnixMilli(), Domain: domain}}}}}
	// A timer cannot wait for a later poll like a batch can: while the
	// function is unreachable it is retried here, and once the budget is
	// spent the instance stops (and the timer fires again after the
	// restart, the epoch being aborted). A shutdown that cuts the call
	// short leaves the timer for the next start, and the final
	// checkpoint commits the rest (an UnavailableError, sluice.TimerFunc).
	for attempt := 1; ; attempt++ {
		err := f.run(ctx.Context(), ctx.Task(), callTime{ctx.Now(), ctx.CurrentWatermark()}, []*keyCall{k})
		if err == nil {
			break
		}
		if ctx.Context().Err() != nil {
			// The shutdown cut the call short: the timer fires again
			// after the restart, and the final checkpoint commits the
			// rest of the epoch (sluice.TimerFunc).
			return &sluice.UnavailableError{Err: fmt.Errorf("function: timer of key %q: %w", t.Key, err)}
		}
		if attempt > f.o.Retries {
			return sluice.Fatal(fmt.Errorf("function: timer of key %q: %w", t.Key, err))
		}
		if serr := sleep(ctx.Context(), f.o.backoff(attempt)); serr != nil {
			return &sluice.UnavailableError{Err: fmt.Errorf("function: timer of key %q: %w", t.Key, serr)}
		}
	}
	if k.err != nil {
		return f.failure(k.key, k.err)
	}
	if reason, failed := k.failed[0]; failed {
		return f.failure(k.key, failedErr(reason))
	}
	return f.apply(ctx, k.result)
}

// failedErr is why a record or timer a PARTIAL result lists failed.
func failedErr(reason string) error {
	return fmt.Errorf("the function failed the event: %s", reason)
}

// failure is the error a failed key's records (or a failed record) return:
// a dead letter with sluice.stage=function, or with OnFailure=Fail a fatal
// one.
func (f *fn) failure(key []byte, err error) error {
	err = fmt.Errorf("key %q: %w", key, err)
	if f.o.OnFailure == Fail {
		return sluice.Fatal(fmt.Errorf("function: %w", err))
	}
	return &sluice.StageError{Stage: "function", Err: err}
}

// apply carries out a key's result through the record's Context: it joins
// the epoch like an in-process job's writes and outputs. The result was
// checked when it arrived (check).
func (f *fn) apply(ctx sluice.Context, r *functionv1.KeyResult) error {
	for _, m := range r.GetStates() {
		st := f.states[f.index[m.GetName()]]
		var err error
		if m.GetDelete() {
			err = st.Clear(ctx)
		} else {
			err = st.Set(ctx, m.GetValue())
		}
		if err != nil {
			return err
		}
	}
	for _, o := range r.GetOutputs() {
		hs := make([]sluice.Header, len(o.GetHeaders()))
		for i, h := range o.GetHeaders() {
			hs[i] = sluice.Header{Key: h.GetKey(), Value: h.GetValue()}
		}
		out := ctx
		if o.TimestampMs != nil {
			out = sluice.WithTimestamp(ctx, time.UnixMilli(o.GetTimestampMs()))
		}
		if o.GetTag() == "" {
			out.Emit(o.GetKey(), o.GetValue(), hs...)
		} else {
			out.Output(sluice.OutputTag(o.GetTag()), o.GetKey(), o.GetValue(), hs...)
		}
	}
	for _, t := range r.GetTimers() {
		at := time.UnixMilli(t.GetAtMs())
		event := t.GetDomain() == functionv1.TimeDomain_EVENT_TIME // checked on arrival
		switch {
		case t.GetDelete() && event:
			ctx.Timers().DeleteEventTime(at)
		case t.GetDelete():
			ctx.Timers().DeleteProcessingTime(at)
		case event:
			ctx.Timers().RegisterEventTime(at)
		default:
			ctx.Timers().RegisterProcessingTime(at)
		}
	}
	return nil
}

func recordEvent(r *sluice.Record, eventTimeMs *int64) *functionv1.Event {
	var hs []*functionv1.Header
	for _, h := range r.Headers {
		hs = append(hs, &functionv1.Header{Key: h.Key, Value: h.Value})
	}
	return &functionv1.Event{Event: &functionv1.Event_Record{Record: &functionv1.Record{
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, TimestampMs: r.Timestamp.UnixMilli(),
		Key: r.Key, Value: r.Value, Headers: hs, EventTimeMs: eventTimeMs,
	}}}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
