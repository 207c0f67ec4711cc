package function

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	functionv1 "github.com/sluicehq/sluice/function/functionv1"
	"github.com/sluicehq/sluice/function/functionv1/functionv1connect"
)

// DescribeError is a function whose Describe answer the processor cannot
// run with: another protocol version, or invalid declarations. It is a
// configuration error (the binary exits 2 on it).
type DescribeError struct {
	URL    string
	Reason string
}

func (e *DescribeError) Error() string {
	return fmt.Sprintf("function at %s: %s", e.URL, e.Reason)
}

// Spec is what a function declared in Describe.
type Spec struct {
	States      []StateSpec
	SideOutputs []string
	// EventTime: the function works in event time (the records' event
	// times drive a watermark, and it may set event-time timers).
	EventTime bool
	// EventTimeSource is where a record's event time is, for a function
	// in event time; nil: its Kafka timestamp.
	EventTimeSource *functionv1.EventTimeSource
	eventTime       *eventTimeSource // EventTimeSource, checked
}

// StateSpec is one declared state.
type StateSpec struct {
	Name string
	TTL  time.Duration // 0: never expires
}

// features are what this processor supports beyond the protocol's first
// form, sent with Describe (DescribeRequest.features): a function that
// needs one a processor lacks refuses it there.
var features = []string{"event_time", "partial", "output_timestamp", "event_time_source"}

// describe asks the function for its Spec. While it cannot be reached or
// fails to answer (it starts beside the processor and may not listen yet)
// describe asks again with backoff until ctx ends; a server that does not
// serve Describe at all, refuses this processor, or answers what does not
// decode is a *DescribeError.
func describe(ctx context.Context, o Options, client functionv1connect.FunctionServiceClient) (Spec, error) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, o.Timeout)
		resp, err := client.Describe(cctx, connect.NewRequest(&functionv1.DescribeRequest{ProtocolVersion: ProtocolVersion, AppId: o.AppID, Features: features}))
		cancel()
		if err == nil {
			return checkSpec(o.URL, resp.Msg)
		}
		if ctx.Err() != nil {
			return Spec{}, fmt.Errorf("function at %s: describe: %w", o.URL, ctx.Err())
		}
		switch connect.CodeOf(err) {
		case connect.CodeUnimplemented, connect.CodeNotFound:
			// Something answers, but not the protocol: a wrong URL.
			return Spec{}, &DescribeError{URL: o.URL, Reason: fmt.Sprintf("Describe is not served there (%v)", err)}
		case connect.CodeFailedPrecondition:
			// The function needs what this processor does not do.
			return Spec{}, &DescribeError{URL: o.URL, Reason: fmt.Sprintf("the function refuses this processor: %v", err)}
		case connect.CodeInvalidArgument:
			// Connect's code for an answer that does not decode (both
			// members of a oneof set, a field of the wrong type), or a
			// function that finds the request invalid: asking again
			// gets the same answer.
			return Spec{}, &DescribeError{URL: o.URL, Reason: fmt.Sprintf("its answer cannot be read, or it finds the request invalid: %v", err)}
		}
		wait := o.backoff(attempt)
		o.Logger.Warn("function does not answer Describe yet; asking again", "url", o.URL, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Spec{}, fmt.Errorf("function at %s: describe: %w", o.URL, ctx.Err())
		case <-t.C:
		}
	}
}

// checkSpec validates a Describe answer.
func checkSpec(url string, d *functionv1.DescribeResponse) (Spec, error) {
	bad := func(format string, args ...any) (Spec, error) {
		return Spec{}, &DescribeError{URL: url, Reason: fmt.Sprintf(format, args...)}
	}
	if d.GetProtocolVersion() != ProtocolVersion {
		return bad("protocol version %d is not supported (this processor speaks %d)", d.GetProtocolVersion(), ProtocolVersion)
	}
	var s Spec
	seen := map[string]bool{}
	for _, st := range d.GetStates() {
		switch {
		case st.GetName() == "":
			return bad("a state has an empty name")
		case seen[st.GetName()]:
			return bad("state %q is declared twice", st.GetName())
		case st.GetTtlMs() < 0:
			return bad("state %q has a negative ttl_ms", st.GetName())
		}
		seen[st.GetName()] = true
		s.States = append(s.States, StateSpec{Name: st.GetName(), TTL: time.Duration(st.GetTtlMs()) * time.Millisecond})
	}
	tags := map[string]bool{}
	for _, tag := range d.GetSideOutputs() {
		switch {
		case tag == "":
			return bad("a side output has an empty tag")
		case tags[tag]:
			return bad("side output %q is declared twice", tag)
		}
		tags[tag] = true
		s.SideOutputs = append(s.SideOutputs, tag)
	}
	s.EventTime = d.GetEventTime()
	if src := d.GetEventTimeSource(); src != nil {
		if !s.EventTime {
			return bad("event_time_source is declared without event_time")
		}
		checked, err := newEventTimeSource(src)
		if err != nil {
			return bad("%v", err)
		}
		s.EventTimeSource, s.eventTime = src, checked
	}
	return s, nil
}
