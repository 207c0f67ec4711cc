package function

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sluicehq/sluice"
	functionv1 "github.com/sluicehq/sluice/function/functionv1"
)

// keyCall is one key of a batch: what is sent for it, and its outcome
// (result or err) once run has returned.
type keyCall struct {
	key    []byte
	states []*functionv1.State
	events []*functionv1.Event

	result *functionv1.KeyResult
	err    error // the key failed for good: DEAD_LETTER, out of retries, an invalid result
	// failed are the events a PARTIAL result lists, by their index in
	// events, with the function's reason.
	failed map[int]string
	// applyAt is the event the result applies at (setApplyAt).
	applyAt  int
	attempts int
	lastErr  error
}

// errBudget is the error of keys still unanswered when a batch's retry
// budget (Options.Budget) has passed.
var errBudget = errors.New("the retry budget of the batch is spent")

// Budget is the longest a batch's calls may take, retries and backoff
// included: Retries+1 calls of Timeout and the waits between them, and one
// Timeout more for calls that wait for a free slot (Concurrency). The calls
// run while the epoch's transaction is open, so it must stay below the
// transaction timeout.
func (o Options) Budget() time.Duration {
	o = o.withDefaults()
	d := time.Duration(o.Retries+2) * o.Timeout
	for n := 1; n <= o.Retries; n++ {
		d += o.backoff(n)
	}
	return d
}

// run calls the function for keys, at most Options.Concurrency calls in
// flight, and leaves each key's outcome in it. It returns a
// *sluice.UnavailableError, and no outcome counts, if the function could
// not be reached (or ctx ended: the batch then comes again).
func (f *fn) run(ctx context.Context, task int32, at callTime, keys []*keyCall) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, f.o.Budget())
	defer cancel()
	var (
		mu   sync.Mutex
		down error
	)
	each(f.o.Concurrency, pack(keys, f.o.Batch), func(unit []*keyCall) {
		err := f.runUnit(ctx, task, at, unit)
		if err != nil {
			mu.Lock()
			if down == nil {
				down = err
			}
			mu.Unlock()
			cancel()
		}
	})
	switch {
	case down != nil:
		return &sluice.UnavailableError{Err: fmt.Errorf("function at %s: %w", f.o.URL, down)}
	case parent.Err() != nil:
		return &sluice.UnavailableError{Err: parent.Err()}
	}
	return nil
}

// pack groups keys into calls of at most batch events, in order; a key with
// more events than that is a unit of its own, sent in consecutive calls.
func pack(keys []*keyCall, batch int) [][]*keyCall {
	var units [][]*keyCall
	var cur []*keyCall
	n := 0
	for _, k := range keys {
		if len(k.events) > batch {
			units = append(units, []*keyCall{k})
			continue
		}
		if n+len(k.events) > batch && len(cur) > 0 {
			units = append(units, cur)
			cur, n = nil, 0
		}
		cur = append(cur, k)
		n += len(k.events)
	}
	if len(cur) > 0 {
		units = append(units, cur)
	}
	return units
}

// each runs fn for every item, at most n at a time, and waits for all.
func each[T any](n int, items []T, fn func(T)) {
	sem := make(chan struct{}, max(n, 1))
	var wg sync.WaitGroup
	for _, it := range items {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(it)
		}()
	}
	wg.Wait()
}

// runUnit runs one unit of keys; a single key with more events than a call
// carries goes in chunks, in order, each call given the states the previous
// one left, and its results merged.
func (f *fn) runUnit(ctx context.Context, task int32, at callTime, unit []*keyCall) error {
	if len(unit) != 1 || len(unit[0].events) <= f.o.Batch {
		return f.callKeys(ctx, task, at, unit)
	}
	k := unit[0]
	merged := newMerged(k.states)
	from := 0 // the chunk's first event in k.events
	for chunk := range slices.Chunk(k.events, f.o.Batch) {
		part := &keyCall{key: k.key, states: merged.current(), events: chunk}
		if err := f.callKeys(ctx, task, at, []*keyCall{part}); err != nil {
			return err
		}
		if part.err != nil {
			k.err, k.failed = part.err, nil
			return nil
		}
		for i, reason := range part.failed {
			if k.failed == nil {
				k.failed = map[int]string{}
			}
			k.failed[from+i] = reason
		}
		merged.add(part.result)
		from += len(chunk)
	}
	k.result = merged.result(k.key)
	return nil
}

// callKeys calls the function for ks until each key has an outcome,
// retrying with backoff the keys whose call failed or that were answered
// RETRY. After a failed call each key is retried in a call of its own, so
// a key the function never answers does not hold back the others.
func (f *fn) callKeys(ctx context.Context, task int32, at callTime, ks []*keyCall) error {
	pending := ks
	for len(pending) > 0 {
		var retry []*keyCall
		resp, err := f.invoke(ctx, task, at, pending)
		switch {
		case err != nil && (unreachable(err) || ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded)):
			return err
		case err != nil:
			for _, k := range pending {
				k.lastErr = err
			}
			retry = pending
		default:
			retry = f.settle(pending, resp)
		}
		var next []*keyCall
		for _, k := range retry {
			k.attempts++
			switch {
			case ctx.Err() != nil:
				k.err = fmt.Errorf("%w (%s): %w", errBudget, f.o.Budget(), k.lastErr)
			case k.attempts > f.o.Retries:
				k.err = fmt.Errorf("no answer after %d attempts: %w", k.attempts, k.lastErr)
			default:
				next = append(next, k)
			}
		}
		if len(next) == 0 {
			return nil
		}
		f.m.retries.Add(float64(len(next)))
		if sleep(ctx, f.o.backoff(next[0].attempts)) != nil {
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return ctx.Err() // cancelled: the batch comes again
			}
			for _, k := range next {
				k.err = fmt.Errorf("%w (%s): %w", errBudget, f.o.Budget(), k.lastErr)
			}
			return nil
		}
		if err != nil && len(next) > 1 {
			var mu sync.Mutex
			var down error
			each(f.o.Concurrency, next, func(k *keyCall) {
				if err := f.callKeys(ctx, task, at, []*keyCall{k}); err != nil {
					mu.Lock()
					down = err
					mu.Unlock()
				}
			})
			return down
		}
		pending = next
	}
	return nil
}

// callTime is the clocks a call tells the function: processing time, and
// the task's watermark (zero before it has one).
type callTime struct{ now, watermark time.Time }

// invoke makes one call.
func (f *fn) invoke(ctx context.Context, task int32, at callTime, ks []*keyCall) (*functionv1.InvokeResponse, error) {
	req := &functionv1.InvokeRequest{Task: task, NowMs: at.now.UnixMilli(), Keys: make([]*functionv1.KeyEvents, len(ks))}
	if f.eventTime && !at.watermark.IsZero() {
		wm := at.watermark.UnixMilli()
		req.WatermarkMs = &wm
	}
	events := 0
	for i, k := range ks {
		req.Keys[i] = &functionv1.KeyEvents{Key: k.key, States: k.states, Events: k.events}
		events += len(k.events)
	}
	f.m.records.Observe(float64(events))
	cctx, cancel := context.WithTimeout(ctx, f.o.Timeout)
	defer cancel()
	start := time.Now()
	resp, err := f.client.Invoke(cctx, connect.NewRequest(req))
	f.m.duration.Observe(time.Since(start).Seconds())
	if err != nil {
		if unreachable(err) {
			f.m.calls.WithLabelValues(resultUnavailable).Inc()
		} else {
			f.m.calls.WithLabelValues(resultError).Inc()
		}
		return nil, err
	}
	return resp.Msg, nil
}

// settle takes each key's result from a reply and returns the keys to try
// again.
func (f *fn) settle(ks []*keyCall, resp *functionv1.InvokeResponse) (retry []*keyCall) {
	results := make(map[string]*functionv1.KeyResult, len(resp.GetResults()))
	for _, r := range resp.GetResults() {
		results[string(r.GetKey())] = r
	}
	failed := false
	for _, k := range ks {
		r := results[string(k.key)]
		switch {
		case r == nil:
			k.lastErr = errors.New("the reply has no result for the key")
			retry = append(retry, k)
		case r.GetStatus() == functionv1.Status_RETRY:
			k.lastErr = fmt.Errorf("the function answered RETRY: %s", r.GetReason())
			retry = append(retry, k)
		case r.GetStatus() == functionv1.Status_DEAD_LETTER:
			k.err = fmt.Errorf("the function answered DEAD_LETTER: %s", r.GetReason())
		case r.GetStatus() != functionv1.Status_OK && r.GetStatus() != functionv1.Status_PARTIAL:
			k.err = fmt.Errorf("the function answered an unknown status %d", r.GetStatus())
		default:
			err := f.check(k.key, r)
			if err == nil {
				k.failed, err = checkFailed(k, r)
			}
			if err != nil {
				k.err = err
			} else {
				k.result = r
			}
		}
		failed = failed || k.err != nil || k.result == nil || len(k.failed) > 0
	}
	if failed {
		f.m.calls.WithLabelValues(resultKeyFailed).Inc()
	} else {
		f.m.calls.WithLabelValues(resultOK).Inc()
	}
	return retry
}

// setApplyAt sets applyAt to the key's last event that its result does not
// fail: a failed record is dead-lettered, which rolls back what it wrote.
// A result that fails them all changes nothing (checkFailed): -1.
func (k *keyCall) setApplyAt() {
	k.applyAt = len(k.events) - 1
	for k.applyAt >= 0 {
		if _, failed := k.failed[k.applyAt]; !failed {
			return
		}
		k.applyAt--
	}
}

// checkFailed returns the events a PARTIAL result lists, or why the list is
// invalid: an OK result lists none, an event is listed once and exists, and
// a result that fails every event changes nothing (there is no event left
// to apply it at, and nothing it could stand for).
func checkFailed(k *keyCall, r *functionv1.KeyResult) (map[int]string, error) {
	fs := r.GetFailedEvents()
	switch {
	case len(fs) == 0:
		return nil, nil
	case r.GetStatus() != functionv1.Status_PARTIAL:
		return nil, errors.New("the result lists failed events without the status PARTIAL")
	}
	failed := make(map[int]string, len(fs))
	for _, e := range fs {
		i := int(e.GetIndex())
		switch _, dup := failed[i]; {
		case i < 0 || i >= len(k.events):
			return nil, fmt.Errorf("the result fails event %d of a call of %d events", i, len(k.events))
		case dup:
			return nil, fmt.Errorf("the result fails event %d twice", i)
		}
		failed[i] = e.GetReason()
	}
	if len(failed) == len(k.events) && (len(r.GetStates()) > 0 || len(r.GetOutputs()) > 0 || len(r.GetTimers()) > 0) {
		return nil, errors.New("the result fails every event of the key and yet changes state, emits or sets timers")
	}
	return failed, nil
}

// check validates a key's OK result against the declarations.
func (f *fn) check(key []byte, r *functionv1.KeyResult) error {
	for _, m := range r.GetStates() {
		if _, ok := f.index[m.GetName()]; !ok {
			return fmt.Errorf("the result sets state %q, which the function did not declare", m.GetName())
		}
		if n := len(m.GetValue()); !m.GetDelete() && n > f.o.MaxStateBytes {
			return fmt.Errorf("state %q of key %q is %d bytes, above the limit of %d (SLUICE_FUNCTION_MAX_STATE_BYTES)", m.GetName(), key, n, f.o.MaxStateBytes)
		}
	}
	for _, o := range r.GetOutputs() {
		if o.GetTag() != "" && !f.tags[o.GetTag()] {
			return fmt.Errorf("the result writes to side output %q, which the function did not declare", o.GetTag())
		}
	}
	for _, t := range r.GetTimers() {
		switch {
		case t.GetAtMs() < 0:
			return fmt.Errorf("the result sets a timer at %d ms, before 1970", t.GetAtMs())
		case t.GetDomain() == functionv1.TimeDomain_EVENT_TIME && !f.eventTime:
			return errors.New("the result sets an event-time timer, and the function did not declare event_time")
		case t.GetDomain() != functionv1.TimeDomain_EVENT_TIME && t.GetDomain() != functionv1.TimeDomain_PROCESSING_TIME:
			return fmt.Errorf("the result sets a timer of an unknown domain %d", t.GetDomain())
		}
	}
	return nil
}

// mergedResult folds the results of a key's consecutive calls into one.
type mergedResult struct {
	states  map[string][]byte
	deleted map[string]bool // touched and deleted
	touched map[string]bool
	outputs []*functionv1.Output
	timers  []*functionv1.TimerMutation
}

func newMerged(states []*functionv1.State) *mergedResult {
	m := &mergedResult{states: map[string][]byte{}, deleted: map[string]bool{}, touched: map[string]bool{}}
	for _, st := range states {
		m.states[st.GetName()] = st.GetValue()
	}
	return m
}

func (m *mergedResult) add(r *functionv1.KeyResult) {
	for _, s := range r.GetStates() {
		name := s.GetName()
		m.touched[name] = true
		m.deleted[name] = s.GetDelete()
		if s.GetDelete() {
			delete(m.states, name)
		} else {
			m.states[name] = s.GetValue()
		}
	}
	m.outputs = append(m.outputs, r.GetOutputs()...)
	m.timers = append(m.timers, r.GetTimers()...)
}

// current is the key's states as the next call must see them.
func (m *mergedResult) current() []*functionv1.State {
	var out []*functionv1.State
	for _, name := range slices.Sorted(maps.Keys(m.states)) {
		out = append(out, &functionv1.State{Name: name, Value: m.states[name]})
	}
	return out
}

func (m *mergedResult) result(key []byte) *functionv1.KeyResult {
	r := &functionv1.KeyResult{Key: key, Outputs: m.outputs, Timers: m.timers}
	for _, name := range slices.Sorted(maps.Keys(m.touched)) {
		r.States = append(r.States, &functionv1.StateMutation{Name: name, Value: m.states[name], Delete: m.deleted[name]})
	}
	return r
}
