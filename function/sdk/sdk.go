package sdk

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	functionv1 "github.com/sluicehq/sluice/function/functionv1"
	"github.com/sluicehq/sluice/function/functionv1/functionv1connect"
)

// State is a declared state: its name and TTL (0: never expires).
type State struct {
	Name string
	TTL  time.Duration
}

// Declaration is what the function answers to Describe.
type Declaration struct {
	States      []State
	SideOutputs []string
	// EventTime: the function works in event time. Each call carries the
	// task's watermark (Call.Watermark), and the function may set
	// event-time timers (Result.SetEventTimer).
	EventTime bool
	// EventTimeSource, with EventTime, says where a record's event time
	// is: a field of its JSON value (JsonPointer, RFC 6901) or a header,
	// in a TimeFormat; the processor reads it before each call. Nil: the
	// records' Kafka timestamps. For example
	//
	//	&functionv1.EventTimeSource{From: &functionv1.EventTimeSource_JsonPointer{JsonPointer: "/ts"}, Format: functionv1.TimeFormat_RFC3339}
	//
	// Format is required.
	EventTimeSource *functionv1.EventTimeSource
}

// Call is one key's events with its current states (unset states absent).
type Call struct {
	Task int32
	Now  time.Time // the processor's processing-time clock
	// Watermark is the task's event-time watermark when the call was made,
	// for a function in event time; zero before the task has one.
	Watermark time.Time
	Key       []byte
	States    map[string][]byte
	Events    []Event
}

// Event is a record, or a timer of the key that fired (Record nil, Timer
// set; EventTime says its domain).
type Event struct {
	Record    *functionv1.Record
	Timer     time.Time
	EventTime bool // the timer is an event-time timer
}

// Func handles one key. It must be a pure function of the call: the same
// events come again after a failure or a rebalance.
type Func func(ctx context.Context, c *Call) *Result

// Result is what to do for the key. The zero value is OK with no effects.
type Result struct{ r functionv1.KeyResult }

// Set gives state name a new value.
func (r *Result) Set(name string, value []byte) {
	r.r.States = append(r.r.States, &functionv1.StateMutation{Name: name, Value: value})
}

// Delete unsets state name.
func (r *Result) Delete(name string) {
	r.r.States = append(r.r.States, &functionv1.StateMutation{Name: name, Delete: true})
}

// Emit produces a record to the job's output topic.
func (r *Result) Emit(key, value []byte, headers ...*functionv1.Header) {
	r.EmitTo("", key, value, headers...)
}

// EmitTo produces a record to a declared side output ("" is the output).
// Emit and EmitTo stamp it with the time of what the call answers: the
// event time (the Kafka time, or what Declaration.EventTimeSource reads)
// of the key's last record in the batch that the result does not Fail, or
// the timer's.
func (r *Result) EmitTo(tag string, key, value []byte, headers ...*functionv1.Header) {
	r.r.Outputs = append(r.r.Outputs, &functionv1.Output{Key: key, Value: value, Headers: headers, Tag: tag})
}

// EmitAt produces a record to tag ("" is the output) with the Kafka
// timestamp at, in milliseconds; a time before 1970 or after 2262 gives the
// processor's processing time instead.
func (r *Result) EmitAt(tag string, at time.Time, key, value []byte, headers ...*functionv1.Header) {
	ms := at.UnixMilli()
	r.r.Outputs = append(r.r.Outputs, &functionv1.Output{Key: key, Value: value, Headers: headers, Tag: tag, TimestampMs: &ms})
}

// SetTimer sets a processing-time timer of the key.
func (r *Result) SetTimer(at time.Time) {
	r.r.Timers = append(r.r.Timers, &functionv1.TimerMutation{AtMs: at.UnixMilli()})
}

// DeleteTimer deletes the key's processing-time timer at at.
func (r *Result) DeleteTimer(at time.Time) {
	r.r.Timers = append(r.r.Timers, &functionv1.TimerMutation{AtMs: at.UnixMilli(), Delete: true})
}

// SetEventTimer sets an event-time timer of the key: it fires once the
// task's watermark reaches at. Only for a function declared in event time.
func (r *Result) SetEventTimer(at time.Time) {
	r.r.Timers = append(r.r.Timers, &functionv1.TimerMutation{AtMs: at.UnixMilli(), Domain: functionv1.TimeDomain_EVENT_TIME})
}

// DeleteEventTimer deletes the key's event-time timer at at.
func (r *Result) DeleteEventTimer(at time.Time) {
	r.r.Timers = append(r.r.Timers, &functionv1.TimerMutation{AtMs: at.UnixMilli(), Delete: true, Domain: functionv1.TimeDomain_EVENT_TIME})
}

// Retry asks for the key's events again (within the processor's budget).
func (r *Result) Retry(reason string) *Result {
	r.r = functionv1.KeyResult{Status: functionv1.Status_RETRY, Reason: reason}
	return r
}

// Fail sends one event of the call, c.Events[event], to the dead-letter
// topic with reason, and lets the rest of the result apply: the result is
// then the key's state and outputs as of the other events, which is what
// the function computes by skipping the failed one. Fail each event at
// most once. A result that fails every event must set no state, emit
// nothing and set no timer. For a timer event, the timer is dead-lettered.
// After DeadLetter or Retry, Fail does nothing. (A processor that predates
// Fail dead-letters all the key's events of the call instead, as
// DeadLetter.)
func (r *Result) Fail(event int, reason string) *Result {
	if s := r.r.Status; s == functionv1.Status_DEAD_LETTER || s == functionv1.Status_RETRY {
		return r // the whole key's fate is set already
	}
	r.r.Status = functionv1.Status_PARTIAL
	r.r.FailedEvents = append(r.r.FailedEvents, &functionv1.FailedEvent{Index: int32(event), Reason: reason})
	return r
}

// DeadLetter sends the key's events of the call to the dead-letter topic.
func (r *Result) DeadLetter(reason string) *Result {
	r.r = functionv1.KeyResult{Status: functionv1.Status_DEAD_LETTER, Reason: reason}
	return r
}

// Handler serves fn under the protocol's paths.
func Handler(d Declaration, fn Func) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(functionv1connect.NewFunctionServiceHandler(&service{d: d, fn: fn},
		connect.WithCodec(jsonCodec{"json"}), connect.WithCodec(jsonCodec{"json; charset=utf-8"})))
	return mux
}

// jsonCodec is connect's JSON codec but for enums, which it writes as
// numbers: a processor that predates a status (PARTIAL) reads an unknown
// name as 0, OK, and would apply a result without its failures, while an
// unknown number stays itself and fails the key.
type jsonCodec struct{ name string }

func (c jsonCodec) Name() string { return c.name }

func (jsonCodec) Marshal(m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("sdk: %T is not a proto.Message", m)
	}
	return protojson.MarshalOptions{UseEnumNumbers: true}.Marshal(pm)
}

func (jsonCodec) Unmarshal(b []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("sdk: %T is not a proto.Message", m)
	}
	if len(b) == 0 {
		return errors.New("sdk: a zero-length payload is not a JSON object")
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, pm)
}

type service struct {
	d  Declaration
	fn Func
}

func (s *service) Describe(_ context.Context, req *connect.Request[functionv1.DescribeRequest]) (*connect.Response[functionv1.DescribeResponse], error) {
	if s.d.EventTime && !slices.Contains(req.Msg.GetFeatures(), "event_time") {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			errors.New("this function works in event time, which the processor does not support (features "+strings.Join(req.Msg.GetFeatures(), ",")+"): upgrade the processor"))
	}
	if s.d.EventTimeSource != nil && !slices.Contains(req.Msg.GetFeatures(), "event_time_source") {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			errors.New("this function says where its records' event time is, which the processor does not support (features "+strings.Join(req.Msg.GetFeatures(), ",")+"): upgrade the processor"))
	}
	resp := &functionv1.DescribeResponse{ProtocolVersion: 1, SideOutputs: s.d.SideOutputs, EventTime: s.d.EventTime, EventTimeSource: s.d.EventTimeSource}
	for _, st := range s.d.States {
		resp.States = append(resp.States, &functionv1.StateSpec{Name: st.Name, TtlMs: st.TTL.Milliseconds()})
	}
	return connect.NewResponse(resp), nil
}

func (s *service) Invoke(ctx context.Context, req *connect.Request[functionv1.InvokeRequest]) (*connect.Response[functionv1.InvokeResponse], error) {
	in := req.Msg
	out := &functionv1.InvokeResponse{Results: make([]*functionv1.KeyResult, 0, len(in.GetKeys()))}
	for _, k := range in.GetKeys() {
		c := &Call{Task: in.GetTask(), Now: time.UnixMilli(in.GetNowMs()), Key: k.GetKey(), States: make(map[string][]byte, len(k.GetStates())), Events: make([]Event, len(k.GetEvents()))}
		if in.WatermarkMs != nil {
			c.Watermark = time.UnixMilli(in.GetWatermarkMs())
		}
		for _, st := range k.GetStates() {
			c.States[st.GetName()] = st.GetValue()
		}
		for i, e := range k.GetEvents() {
			if t := e.GetTimer(); t != nil {
				c.Events[i] = Event{Timer: time.UnixMilli(t.GetAtMs()), EventTime: t.GetDomain() == functionv1.TimeDomain_EVENT_TIME}
			} else {
				c.Events[i] = Event{Record: e.GetRecord()}
			}
		}
		r := s.fn(ctx, c)
		if r == nil {
			r = &Result{}
		}
		r.r.Key = k.GetKey()
		out.Results = append(out.Results, &r.r)
	}
	return connect.NewResponse(out), nil
}

// ListenAndServe serves h on addr (host:port, or unix:/path) with HTTP/1.1
// and cleartext HTTP/2 (for gRPC), until the listener fails.
func ListenAndServe(addr string, h http.Handler) error {
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
		os.Remove(path)
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	return Serve(ln, h)
}

// Serve is ListenAndServe on a listener of the caller's.
func Serve(ln net.Listener, h http.Handler) error {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}
