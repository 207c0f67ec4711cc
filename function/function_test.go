package function_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/function"
	functionv1 "github.com/sluicehq/sluice/function/functionv1"
	"github.com/sluicehq/sluice/function/functionv1/functionv1connect"
	"github.com/sluicehq/sluice/function/sdk"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/internal/tutorial"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

// startPython runs one of the example functions as a subprocess on a unix
// socket and returns its URL. python3 is required (.ci/run installs it):
// without it the test fails rather than skips.
func startPython(t *testing.T, script string, env ...string) string {
	t.Helper()
	return startPythonAt(t, filepath.Join("..", "examples", "function-python", script), env...)
}

// startPythonAt runs the Python function at path on a unix socket and
// returns its URL.
func startPythonAt(t *testing.T, path string, env ...string) string {
	t.Helper()
	script := filepath.Base(path)
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed for the Python SDK's tests: %v", err)
	}
	sock := filepath.Join(t.TempDir(), "fn.sock")
	cmd := exec.Command(py, path)
	cmd.Env = append(os.Environ(), append(env, "FUNCTION_LISTEN=unix:"+sock, "PYTHONDONTWRITEBYTECODE=1")...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("%s:\n%s", script, log.String())
		}
	})
	return "unix://" + sock
}

// startGo serves a Go SDK function on a loopback port.
func startGo(t *testing.T, d sdk.Declaration, fn sdk.Func) string {
	t.Helper()
	return serve(t, sdk.Handler(d, fn))
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go sdk.Serve(ln, h)
	t.Cleanup(func() { ln.Close() })
	return "http://" + ln.Addr().String()
}

func newJob(t *testing.T, o function.Options) sluice.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job, err := function.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// valuesByKey is each key's values, in order.
func valuesByKey(recs []sluice.Record) map[string][]string {
	out := map[string][]string{}
	for _, r := range recs {
		out[string(r.Key)] = append(out[string(r.Key)], string(r.Value))
	}
	return out
}

func values(recs []sluice.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}

func header(r sluice.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// The tutorial's temperature-alert, computed by the Python example function,
// emits exactly the tutorial's three alerts.
func TestPythonTemperatureAlert(t *testing.T) {
	job := newJob(t, function.Options{URL: startPython(t, "temperature_alert.py")})
	if !slices.Equal(job.States, []string{"last-temperature"}) {
		t.Fatalf("states from Describe: %v", job.States)
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Kill() // the readings wait, so that a poll takes them together
	for i, r := range tutorial.Readings {
		id, _, _ := strings.Cut(r, ",")
		h.Send([]byte(id), []byte(r), time.Time{})
		if i == 2 {
			// A bad reading between a sensor's good ones goes to the
			// dead-letter topic alone, and changes no alert.
			h.Send([]byte(id), []byte(id+",x,hot"), time.Time{})
		}
	}
	h.Restart()
	h.Settle()
	out := h.Output()
	if got, want := values(out), tutorial.AlertValues(); !slices.Equal(got, want) {
		t.Fatalf("alerts:\n got %q\nwant %q", got, want)
	}
	for i, r := range out {
		if string(r.Key) != tutorial.Alerts[i].ID {
			t.Errorf("alert %d keyed %q, want %q", i, r.Key, tutorial.Alerts[i].ID)
		}
	}
	if dl := h.DeadLetters(); len(dl) != 1 || !strings.HasSuffix(string(dl[0].Value), ",x,hot") || !strings.Contains(header(dl[0], "sluice.error"), "want id,epochSeconds,temperature") {
		t.Fatalf("dead letters: %q, want the bad reading alone", values(dl))
	}
}

// The Python aggregate keeps its state across calls and across a restart
// of the processor (the state lives in Sluice, not in the function).
func TestPythonAggregateKeepsState(t *testing.T) {
	job := newJob(t, function.Options{URL: startPython(t, "aggregate.py")})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("k"), []byte("5"), time.Time{})
	h.Send([]byte("k"), []byte("-2"), time.Time{})
	h.Settle()
	h.Kill()
	h.Restart()
	h.Send([]byte("k"), []byte("9"), time.Time{})
	h.Settle()
	want := []string{
		`{"count":1,"sum":5,"min":5,"max":5}`,
		`{"count":2,"sum":3,"min":-2,"max":5}`,
		`{"count":3,"sum":12,"min":-2,"max":9}`,
	}
	if got := values(h.Output()); !slices.Equal(got, want) {
		t.Fatalf("outputs:\n got %q\nwant %q", got, want)
	}
}

// stuckAggregate counts values per key but never answers for the key
// "stuck": the call hangs until the test ends, so the processor's timeout
// ends each of its attempts. (Waiting on the call's own context raced
// with that timeout: the context ends at the deadline the client sends in
// its timeout header, the client's own, and on a busy machine an answer
// sent then could be read before the client's timer fired.)
func stuckAggregate(t *testing.T) sdk.Func {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(_ context.Context, c *sdk.Call) *sdk.Result {
		if string(c.Key) == "stuck" {
			<-release
			return (&sdk.Result{}).Retry("the test ended")
		}
		r := &sdk.Result{}
		n := len(c.States["n"])
		for _, e := range c.Events {
			n++
			r.Emit(e.Record.GetKey(), fmt.Appendf(nil, "%s:%d", e.Record.GetKey(), n))
		}
		r.Set("n", make([]byte, n))
		return r
	}
}

// A function that never answers for one key: the batch's other keys
// commit, that key's records end in the dead-letter topic after the retry
// budget with sluice.stage=function, and nothing is lost.
func TestKeyNeverAnsweredGoesToTheDeadLetterTopic(t *testing.T) {
	url := startGo(t, sdk.Declaration{States: []sdk.State{{Name: "n"}}}, stuckAggregate(t))
	reg := prometheus.NewRegistry()
	// Batch 1: each key is a call of its own, so the other keys' answers
	// do not wait for the stuck key's first call to time out.
	job := newJob(t, function.Options{URL: url, Timeout: time.Second, Retries: 2, Backoff: 10 * time.Millisecond, Batch: 1, Registry: reg})
	h := sluicetest.New(t, job, sluicetest.Options{})
	for _, k := range []string{"a", "stuck", "b", "stuck", "a"} {
		h.Send([]byte(k), []byte("1"), time.Time{})
	}
	h.Settle()
	// A key's result is applied at its last record of the batch, so the
	// order across keys depends on how the records were batched: a:1 comes
	// before b:1 when the first a was a batch of its own, after it when
	// all five were one.
	if got, want := valuesByKey(h.Output()), map[string][]string{"a": {"a:1", "a:2"}, "b": {"b:1"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("outputs by key %q, want %q", got, want)
	}
	dl := h.DeadLetters()
	if len(dl) != 2 {
		t.Fatalf("dead letters %q, want the two records of key stuck", values(dl))
	}
	for i, r := range dl {
		// Given up after its attempts, or when its batch's budget ran out
		// first: the records may come in one batch or in two, and a
		// busy machine can spend a batch's budget before the third
		// attempt.
		why := header(r, sluice.HeaderError)
		if string(r.Key) != "stuck" || header(r, sluice.HeaderStage) != "function" ||
			!strings.Contains(why, "no answer after 3 attempts") && !strings.Contains(why, "the retry budget of the batch is spent") {
			t.Errorf("dead letter %d: key %q, error %q, headers %v", i, r.Key, why, r.Headers)
		}
	}
	if off := header(dl[0], sluice.HeaderOffset); off != "1" {
		t.Errorf("first dead letter is of offset %s, want 1", off)
	}
	// Each stuck record's key was tried three times: two retries each.
	for _, m := range []struct {
		name string
		min  float64
	}{{"sluice_function_retries_total", 2}, {"sluice_function_calls_total", 3}} {
		if v, err := check.MetricSum(reg, m.name); err != nil || v < m.min {
			t.Errorf("%s = %v (%v), want at least %v", m.name, v, err, m.min)
		}
	}
	// The stuck key's attempts time out (error); none is answered, so
	// no call ends with a key's RETRY (key_failed).
	if errs, failed := callsWithResult(t, reg, "error"), callsWithResult(t, reg, "key_failed"); errs < 1 || failed != 0 {
		t.Errorf(`sluice_function_calls_total: error %v, key_failed %v; want at least one error and no key_failed`, errs, failed)
	}
}

// With OnFailure = Fail the instance stops instead, and the key's records
// are not committed: a restart gives them to the function again.
func TestKeyNeverAnsweredStopsTheInstanceWithFail(t *testing.T) {
	url := startGo(t, sdk.Declaration{States: []sdk.State{{Name: "n"}}}, stuckAggregate(t))
	// Batch 1, as above: key a is answered whatever the stuck key does.
	job := newJob(t, function.Options{URL: url, Timeout: time.Second, Retries: 1, Backoff: 10 * time.Millisecond, Batch: 1, OnFailure: function.Fail})
	run := startInstance(t, job)
	run.send(t, "a", "stuck")
	err := run.wait(t)
	if err == nil || !sluice.IsFatal(err) || !strings.Contains(err.Error(), `key "stuck"`) {
		t.Fatalf("Run returned %v, want a fatal error naming key stuck", err)
	}
	if off := run.committed(t); off > 1 {
		t.Fatalf("committed offset %d: the stuck key's record (offset 1) was committed", off)
	}
}

// describeOnly is a function server whose Describe answer the test
// chooses; Invoke is never reached.
type describeOnly struct {
	functionv1connect.UnimplementedFunctionServiceHandler
	resp *functionv1.DescribeResponse
}

func (d describeOnly) Describe(context.Context, *connect.Request[functionv1.DescribeRequest]) (*connect.Response[functionv1.DescribeResponse], error) {
	return connect.NewResponse(d.resp), nil
}

func TestDescribeMismatchIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *functionv1.DescribeResponse
		want string
	}{
		{"version", &functionv1.DescribeResponse{ProtocolVersion: 2}, "protocol version 2 is not supported"},
		{"no version", &functionv1.DescribeResponse{}, "protocol version 0 is not supported"},
		{"empty state name", &functionv1.DescribeResponse{ProtocolVersion: 1, States: []*functionv1.StateSpec{{}}}, "a state has an empty name"},
		{"state twice", &functionv1.DescribeResponse{ProtocolVersion: 1, States: []*functionv1.StateSpec{{Name: "s"}, {Name: "s"}}}, `state "s" is declared twice`},
		{"negative ttl", &functionv1.DescribeResponse{ProtocolVersion: 1, States: []*functionv1.StateSpec{{Name: "s", TtlMs: -1}}}, "negative ttl_ms"},
		{"tag twice", &functionv1.DescribeResponse{ProtocolVersion: 1, SideOutputs: []string{"x", "x"}}, `side output "x" is declared twice`},
		{"event time source without event time", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTimeSource: pointerSource("/t", millis)},
			"event_time_source is declared without event_time"},
		{"event time source from nothing", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTime: true, EventTimeSource: &functionv1.EventTimeSource{Format: millis}},
			"neither a jsonPointer nor a header"},
		{"no time format", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTime: true, EventTimeSource: pointerSource("/t", 0)},
			"the format TIME_FORMAT_UNSPECIFIED, which this processor does not know"},
		{"bad JSON pointer", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTime: true, EventTimeSource: pointerSource("t", millis)},
			`JSON Pointer "t": want "" or one starting with /`},
		{"bad JSON pointer escape", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTime: true, EventTimeSource: pointerSource("/a~2", millis)},
			"~ must be followed by 0 or 1"},
		{"empty header", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTime: true,
			EventTimeSource: &functionv1.EventTimeSource{From: &functionv1.EventTimeSource_Header{}, Format: millis}}, "names an empty header"},
		{"unknown time format", &functionv1.DescribeResponse{ProtocolVersion: 1, EventTime: true, EventTimeSource: pointerSource("/t", 7)},
			"the format 7, which this processor does not know"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.Handle(functionv1connect.NewFunctionServiceHandler(describeOnly{resp: tc.resp}))
			url := serve(t, mux)
			_, err := function.New(context.Background(), function.Options{URL: url})
			var de *function.DescribeError
			if !errorAs(err, &de) || !strings.Contains(de.Reason, tc.want) {
				t.Fatalf("New: %v, want a DescribeError saying %q", err, tc.want)
			}
		})
	}
}

// A state value above the cap fails the key, naming key and state, rather
// than being truncated.
func TestStateAboveTheCapIsAnError(t *testing.T) {
	url := startGo(t, sdk.Declaration{States: []sdk.State{{Name: "blob"}}}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		r.Set("blob", make([]byte, 100*len(c.Key)))
		r.Emit(c.Key, []byte("ok"))
		return r
	})
	job := newJob(t, function.Options{URL: url, MaxStateBytes: 1000})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("short"), []byte("1"), time.Time{})            // 500 bytes
	h.Send([]byte("far-too-long-key"), []byte("1"), time.Time{}) // 1600 bytes
	h.Settle()
	if got := values(h.Output()); !slices.Equal(got, []string{"ok"}) {
		t.Fatalf("outputs %q, want the short key's only", got)
	}
	dl := h.DeadLetters()
	if len(dl) != 1 {
		t.Fatalf("dead letters: %q", values(dl))
	}
	msg := header(dl[0], sluice.HeaderError)
	if !strings.Contains(msg, `state "blob" of key "far-too-long-key" is 1600 bytes`) || header(dl[0], sluice.HeaderStage) != "function" {
		t.Fatalf("dead letter error %q, stage %q", msg, header(dl[0], sluice.HeaderStage))
	}
}

// callsWithResult is sluice_function_calls_total{result=result}.
func callsWithResult(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_function_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A server that does not serve the protocol at the URL is refused, not
// waited for.
func TestDescribeNotServedIsRefused(t *testing.T) {
	url := serve(t, http.NotFoundHandler())
	_, err := function.New(context.Background(), function.Options{URL: url})
	var de *function.DescribeError
	if !errorAs(err, &de) || !strings.Contains(de.Reason, "Describe is not served there") {
		t.Fatalf("New: %v, want a DescribeError", err)
	}
}

// A Describe answer that does not decode (here both members of the event
// time source's oneof, in JSON) is refused at once, not asked for again
// as a function that does not answer yet (found at stop 48).
func TestDescribeAnswerThatDoesNotDecodeIsRefused(t *testing.T) {
	var asked atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc(functionv1connect.FunctionServiceDescribeProcedure, func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"protocolVersion":1,"eventTime":true,"eventTimeSource":{"jsonPointer":"/t","header":"t","format":"TIME_FORMAT_UNIX_MILLIS"}}`)
	})
	url := serve(t, mux)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := function.New(ctx, function.Options{URL: url, Protocol: function.JSON})
	var de *function.DescribeError
	if !errorAs(err, &de) || !strings.Contains(de.Reason, "its answer cannot be read") {
		t.Fatalf("New: %v, want a DescribeError saying the answer cannot be read", err)
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("Describe asked %d times, want once", n)
	}
}

// The Python SDK's side outputs, headers, timers and deletes: readings of
// 30 or more to the output and the others to the side output "low", headers
// kept; a minute after a sensor's first reading its timer reports how many
// it saw and clears the count.
func TestPythonSideOutputsHeadersAndTimers(t *testing.T) {
	job := newJob(t, function.Options{URL: startPythonAt(t, filepath.Join("testdata", "split_timer.py"))})
	if !slices.Equal(job.SideOutputs, []sluice.OutputTag{"low"}) {
		t.Fatalf("side outputs from Describe: %v", job.SideOutputs)
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	var high, low []string
	for _, r := range tutorial.Readings {
		f := strings.Split(r, ",")
		id := f[0]
		h.Send([]byte(id), []byte(r), time.Time{}, sluice.Header{Key: "src", Value: []byte(id)})
		if temp, _ := strconv.ParseFloat(f[2], 64); temp >= 30 {
			high = append(high, r)
		} else {
			low = append(low, r)
		}
	}
	h.Settle()
	out, side := h.Output(), h.SideOutput("low")
	// Per sensor the order is kept; across sensors partitions interleave.
	slices.Sort(high)
	slices.Sort(low)
	got := func(recs []sluice.Record) []string {
		v := values(recs)
		slices.Sort(v)
		return v
	}
	if g := got(out); !slices.Equal(g, high) {
		t.Fatalf("output %q, want %q", g, high)
	}
	if g := got(side); !slices.Equal(g, low) {
		t.Fatalf("side output %q, want %q", g, low)
	}
	for _, r := range append(out, side...) {
		if header(r, "src") != string(r.Key) {
			t.Fatalf("record %q lost its header: %v", r.Value, r.Headers)
		}
	}
	h.Advance(2 * time.Minute)
	h.Settle()
	counts := map[string]string{}
	for _, r := range h.Output()[len(out):] {
		counts[string(r.Key)] = string(r.Value)
		at, err := strconv.ParseInt(header(r, "timer-at"), 10, 64)
		if err != nil {
			t.Errorf("timer output %q has no timer-at header: %v", r.Value, err)
		}
		if got := r.Timestamp.UnixMilli(); got != at+5 {
			t.Errorf("timer output %q stamped %d, want the function's timestamp_ms %d", r.Value, got, at+5)
		}
	}
	want := map[string]string{"sensor_1": "seen:3", "sensor_6": "seen:3", "sensor_7": "seen:2", "sensor_10": "seen:2"}
	if !maps.Equal(counts, want) {
		t.Fatalf("timer outputs %v, want %v", counts, want)
	}
}

// A registry holds one function job's metrics until the job is closed:
// sluice.Instance.Close closes the instance's job, after which a new job
// takes the registry; a second Close does nothing, and the closed job
// refuses to run again (its metrics would not be seen).
func TestCloseLetsANewJobTakeTheRegistry(t *testing.T) {
	url := startGo(t, sdk.Declaration{States: []sdk.State{{Name: "n"}}}, stuckAggregate(t))
	reg := prometheus.NewRegistry()
	job := newJob(t, function.Options{URL: url, Registry: reg})
	if job.Close == nil {
		t.Fatal("the function job has no Close")
	}
	if _, err := function.New(context.Background(), function.Options{URL: url, Registry: reg}); err == nil || !strings.Contains(err.Error(), "close that job") {
		t.Fatalf("a second job on the registry: %v, want refused", err)
	}
	in, err := sluice.New(sluice.Options{Brokers: []string{"127.0.0.1:1"}, AppID: "fclose", InstanceID: "i",
		InputTopics: []string{"in"}, OutputTopic: "out", Job: job, StateDir: t.TempDir(),
		Backend: kstate.MemoryBackend, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Close(); err != nil {
		t.Fatal(err)
	}
	// The registry is free once the instance is closed, before anything
	// else closes the job.
	next := newJob(t, function.Options{URL: url, Registry: reg})
	if err := job.Close(); err != nil {
		t.Fatalf("the job's Close after the instance's: %v", err)
	}
	if err := job.Prefetch(nil, nil); err == nil || !strings.Contains(err.Error(), "was closed") {
		t.Fatalf("Prefetch of a closed job: %v, want refused", err)
	}
	if err := job.OnTimer(nil, sluice.Timer{}); err == nil || !strings.Contains(err.Error(), "was closed") {
		t.Fatalf("OnTimer of a closed job: %v, want refused", err)
	}
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
}

// The Python SDK in event time: the call's watermark, an event-time timer
// set and fired as the watermark passes it.
func TestPythonEventTime(t *testing.T) {
	ms := eventTimeT0.UnixMilli()
	runEventTime(t, newJob(t, function.Options{URL: startPythonAt(t, filepath.Join("testdata", "event_timer.py"))}), map[string][]string{
		"k": {"seen wm=None", fmt.Sprintf("fired %d event=True wm=%d", ms+10000, ms+20000)},
		"x": {fmt.Sprintf("seen wm=%d", ms)},
	})
}

// A function in event time refuses a processor that does not list the
// event_time feature in Describe (one that would take its event-time
// timers for processing-time ones), with FAILED_PRECONDITION, in both
// SDKs; and this processor stops on that answer with a DescribeError
// rather than ask again.
func TestEventTimeFunctionRefusesAProcessorWithoutIt(t *testing.T) {
	describeWithout := func(t *testing.T, client functionv1connect.FunctionServiceClient) {
		t.Helper()
		_, err := client.Describe(context.Background(), connect.NewRequest(&functionv1.DescribeRequest{ProtocolVersion: 1}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "event time") {
			t.Fatalf("Describe without features: %v, want FAILED_PRECONDITION about event time", err)
		}
		resp, err := client.Describe(context.Background(), connect.NewRequest(&functionv1.DescribeRequest{ProtocolVersion: 1, Features: []string{"event_time"}}))
		if err != nil || !resp.Msg.GetEventTime() {
			t.Fatalf("Describe with event_time: %v, %v", resp, err)
		}
	}
	t.Run("go", func(t *testing.T) {
		url := startGo(t, sdk.Declaration{EventTime: true}, func(context.Context, *sdk.Call) *sdk.Result { return &sdk.Result{} })
		describeWithout(t, functionv1connect.NewFunctionServiceClient(http.DefaultClient, url, connect.WithProtoJSON()))
		describeWithout(t, functionv1connect.NewFunctionServiceClient(http.DefaultClient, url))
	})
	t.Run("python", func(t *testing.T) {
		url := startPythonAt(t, filepath.Join("testdata", "event_timer.py"))
		sock := strings.TrimPrefix(url, "unix://")
		// This processor's Describe (with its features) is answered...
		newJob(t, function.Options{URL: url})
		// ...and one without them is refused.
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
		describeWithout(t, functionv1connect.NewFunctionServiceClient(hc, "http://fn", connect.WithProtoJSON()))
	})
	t.Run("processor", func(t *testing.T) {
		mux := http.NewServeMux()
		mux.Handle(functionv1connect.NewFunctionServiceHandler(refusing{}))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := function.New(ctx, function.Options{URL: serve(t, mux)})
		var de *function.DescribeError
		if !errorAs(err, &de) || !strings.Contains(de.Reason, "the function refuses this processor") || !strings.Contains(de.Reason, "too old") {
			t.Fatalf("New: %v, want a DescribeError with the function's reason", err)
		}
	})
}

// refusing answers Describe with FAILED_PRECONDITION.
type refusing struct {
	functionv1connect.UnimplementedFunctionServiceHandler
}

func (refusing) Describe(context.Context, *connect.Request[functionv1.DescribeRequest]) (*connect.Response[functionv1.DescribeResponse], error) {
	return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("too old"))
}

const millis = functionv1.TimeFormat_UNIX_MILLIS

func pointerSource(p string, f functionv1.TimeFormat) *functionv1.EventTimeSource {
	return &functionv1.EventTimeSource{From: &functionv1.EventTimeSource_JsonPointer{JsonPointer: p}, Format: f}
}

// Over JSON, a time format whose name the processor does not know (a typo,
// or one of a later release) reads as the zero value, which is refused: it
// is not taken for milliseconds. (Found by review: "SECONDS" read every
// time as milliseconds, in January 1970.)
func TestUnknownTimeFormatNameIsRefused(t *testing.T) {
	for _, name := range []string{"SECONDS", "unix_seconds", "UNIX_MICROS"} {
		url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"protocolVersion":1,"eventTime":true,"eventTimeSource":{"jsonPointer":"/t","format":%q}}`, name)
		}))
		_, err := function.New(context.Background(), function.Options{URL: url, Protocol: function.JSON})
		var de *function.DescribeError
		if !errorAs(err, &de) || !strings.Contains(de.Reason, "TIME_FORMAT_UNSPECIFIED") {
			t.Errorf("format %q: %v, want a DescribeError refusing it", name, err)
		}
	}
}

// Both SDKs refuse a processor that does not list event_time_source when
// the function declares where its event time is, with FAILED_PRECONDITION.
func TestEventTimeSourceRefusesAProcessorWithoutIt(t *testing.T) {
	check := func(t *testing.T, client functionv1connect.FunctionServiceClient) {
		t.Helper()
		_, err := client.Describe(context.Background(), connect.NewRequest(&functionv1.DescribeRequest{ProtocolVersion: 1, Features: []string{"event_time"}}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "event time is") {
			t.Fatalf("Describe without event_time_source: %v, want FAILED_PRECONDITION", err)
		}
		resp, err := client.Describe(context.Background(), connect.NewRequest(&functionv1.DescribeRequest{ProtocolVersion: 1, Features: []string{"event_time", "event_time_source"}}))
		if err != nil || resp.Msg.GetEventTimeSource().GetHeader() != "at" && resp.Msg.GetEventTimeSource().GetJsonPointer() != "/at" {
			t.Fatalf("Describe with it: %v, %v", resp, err)
		}
	}
	t.Run("go", func(t *testing.T) {
		url := startGo(t, sdk.Declaration{EventTime: true, EventTimeSource: pointerSource("/at", millis)}, func(context.Context, *sdk.Call) *sdk.Result { return &sdk.Result{} })
		check(t, functionv1connect.NewFunctionServiceClient(http.DefaultClient, url, connect.WithProtoJSON()))
	})
	t.Run("python", func(t *testing.T) {
		url := startPythonAt(t, filepath.Join("testdata", "event_time_header.py"))
		newJob(t, function.Options{URL: url}) // this processor's Describe is answered, once it listens
		sock := strings.TrimPrefix(url, "unix://")
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
		check(t, functionv1connect.NewFunctionServiceClient(hc, "http://fn", connect.WithProtoJSON()))
	})
}
