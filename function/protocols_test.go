package function_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/examples/function-go/aggregate"
	"github.com/sluicehq/sluice/function"
	functionv1 "github.com/sluicehq/sluice/function/functionv1"
	"github.com/sluicehq/sluice/function/sdk"
	"github.com/sluicehq/sluice/sluicetest"
)

// The Go SDK answers each protocol, over TCP and a unix socket alike.
func TestGoSDKOverEveryProtocol(t *testing.T) {
	tcp := startGo(t, aggregate.Declaration, aggregate.Func)
	sock := filepath.Join(t.TempDir(), "fn.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go sdk.Serve(ln, sdk.Handler(aggregate.Declaration, aggregate.Func))
	for _, tc := range []struct {
		name string
		url  string
		p    function.Protocol
	}{
		{"json", tcp, function.JSON},
		{"proto", tcp, function.Proto},
		{"grpc", tcp, function.GRPC},
		{"grpc over unix", "unix://" + sock, function.GRPC},
		{"json over unix", "unix://" + sock, function.JSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := newJob(t, function.Options{URL: tc.url, Protocol: tc.p})
			h := sluicetest.New(t, job, sluicetest.Options{})
			// Settled one by one: each is a batch (and a call) of its own.
			for _, v := range []string{"4", "x", "-1"} {
				h.Send([]byte("k"), []byte(v), time.Time{})
				h.Settle()
			}
			want := []string{`{"count":1,"sum":4,"min":4,"max":4}`, `{"count":2,"sum":3,"min":-1,"max":4}`}
			if got := values(h.Output()); !slices.Equal(got, want) {
				t.Fatalf("outputs %q, want %q", got, want)
			}
			if dl := h.DeadLetters(); len(dl) != 1 || string(dl[0].Value) != "x" || header(dl[0], "sluice.stage") != "function" {
				t.Fatalf("dead letters %q, want the bad value's", values(dl))
			}
		})
	}
}

// Processing-time timers: the function sets one, it fires between polls
// once the clock passes it, and the function's answer to the timer event
// (an output, a state delete) commits.
func TestProcessingTimeTimersThroughTheFunction(t *testing.T) {
	url := startGo(t, sdk.Declaration{States: []sdk.State{{Name: "armed"}}}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		for _, e := range c.Events {
			if e.Record == nil {
				r.Emit(c.Key, append([]byte("fired:"), c.States["armed"]...))
				r.Delete("armed")
				continue
			}
			r.Set("armed", e.Record.GetValue())
			r.SetTimer(c.Now.Add(time.Minute))
		}
		return r
	})
	job := newJob(t, function.Options{URL: url})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("k"), []byte("v1"), time.Time{})
	h.Settle()
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("outputs before the timer: %q", values(out))
	}
	h.Advance(2 * time.Minute)
	h.Settle()
	if got := values(h.Output()); !slices.Equal(got, []string{"fired:v1"}) {
		t.Fatalf("outputs %q, want the timer's", got)
	}
	h.Advance(2 * time.Minute) // fired once: it is gone
	h.Settle()
	if got := values(h.Output()); len(got) != 1 {
		t.Fatalf("outputs %q, want the timer's only", got)
	}
}

// Outputs carry the Kafka time of the record the call answers, or the
// timer's time, unless the function sets one (sdk's EmitAt, the protocol's
// timestampMs), over each protocol.
func TestOutputTimestampsThroughTheFunction(t *testing.T) {
	url := startGo(t, sdk.Declaration{SideOutputs: []string{"side"}}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		for _, e := range c.Events {
			if e.Record == nil {
				r.Emit(c.Key, []byte("timer"))
				continue
			}
			r.Emit(c.Key, []byte("plain"))
			at := time.UnixMilli(e.Record.GetTimestampMs()).Add(time.Hour)
			r.EmitAt("", at, c.Key, []byte("at"))
			r.EmitAt("side", at.Add(time.Hour), c.Key, []byte("side-at"))
			r.SetTimer(c.Now.Add(time.Minute))
		}
		return r
	})
	for _, p := range []function.Protocol{function.JSON, function.Proto, function.GRPC} {
		t.Run(string(p), func(t *testing.T) {
			job := newJob(t, function.Options{URL: url, Protocol: p})
			h := sluicetest.New(t, job, sluicetest.Options{})
			sent := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
			h.Send([]byte("k"), []byte("v"), sent)
			h.Settle()
			h.Advance(2 * time.Minute)
			h.Settle()
			got := map[string]time.Time{}
			for _, r := range append(h.Output(), h.SideOutput("side")...) {
				got[string(r.Value)] = r.Timestamp
			}
			want := map[string]time.Time{
				"plain":   sent,
				"at":      sent.Add(time.Hour),
				"side-at": sent.Add(2 * time.Hour),
				"timer":   h.Now().Add(-2 * time.Minute).Add(time.Minute).Truncate(time.Millisecond),
			}
			for v, ts := range want {
				if !got[v].Equal(ts) {
					t.Errorf("%s: stamped %v, want %v", v, got[v], ts)
				}
			}
		})
	}
}

// A key with more records in a poll than a call carries goes in consecutive
// calls, each given the state the previous one left: the running
// aggregation stays exact. The records wait while no instance runs, so the
// restarted one polls them together.
func TestKeyLargerThanABatch(t *testing.T) {
	var mu sync.Mutex
	most := 0
	fn := func(ctx context.Context, c *sdk.Call) *sdk.Result {
		mu.Lock()
		most = max(most, len(c.Events))
		mu.Unlock()
		return aggregate.Func(ctx, c)
	}
	job := newJob(t, function.Options{URL: startGo(t, aggregate.Declaration, fn), Batch: 2})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Kill()
	var want []string
	for i := 1; i <= 9; i++ {
		h.Send([]byte("k"), []byte("1"), time.Time{})
		want = append(want, fmt.Sprintf(`{"count":%d,"sum":%d,"min":1,"max":1}`, i, i))
	}
	h.Restart()
	h.Settle()
	if got := values(h.Output()); !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	if most > 2 {
		t.Fatalf("a call carried %d events, above the batch of 2", most)
	}
}

// Calls for disjoint keys of one task are in flight together: the function
// answers key a only once the call for key b has arrived, which with one
// call at a time would never happen (a would run out of retries).
func TestCallsForOtherKeysRunConcurrently(t *testing.T) {
	bArrived := make(chan struct{})
	var once sync.Once
	fn := func(ctx context.Context, c *sdk.Call) *sdk.Result {
		switch string(c.Key) {
		case "a":
			select {
			case <-bArrived:
			case <-ctx.Done():
				return (&sdk.Result{}).Retry("b never came")
			}
		case "b":
			once.Do(func() { close(bArrived) })
		}
		r := &sdk.Result{}
		r.Emit(c.Key, c.Key)
		return r
	}
	job := newJob(t, function.Options{URL: startGo(t, sdk.Declaration{}, fn), Batch: 1, Concurrency: 2, Timeout: 5 * time.Second, Retries: -1})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Kill() // both records wait, so that one poll takes them together
	h.Send([]byte("a"), []byte("1"), time.Time{})
	h.Send([]byte("b"), []byte("1"), time.Time{})
	h.Restart()
	h.Settle()
	if got := values(h.Output()); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("outputs %q, want a then b (each key's result applied at its record)", got)
	}
	if dl := h.DeadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters: %q", values(dl))
	}
}

// A function in event time: each call carries the task's watermark, and an
// event-time timer it sets fires once the watermark passes it (moved by
// another key's record), over each protocol.
func TestEventTimeThroughTheFunction(t *testing.T) {
	url := startGo(t, sdk.Declaration{EventTime: true}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		for _, e := range c.Events {
			if e.Record == nil {
				r.Emit(c.Key, fmt.Appendf(nil, "fired %d event=%v wm=%d", e.Timer.UnixMilli(), e.EventTime, c.Watermark.UnixMilli()))
				continue
			}
			r.Emit(c.Key, fmt.Appendf(nil, "seen wm=%d", c.Watermark.UnixMilli()))
			r.SetEventTimer(time.UnixMilli(e.Record.GetTimestampMs()).Add(10 * time.Second))
		}
		return r
	})
	for _, p := range []function.Protocol{function.JSON, function.GRPC} {
		t.Run(string(p), func(t *testing.T) {
			ms := eventTimeT0.UnixMilli()
			runEventTime(t, newJob(t, function.Options{URL: url, Protocol: p}), map[string][]string{
				"k": {"seen wm=" + fmt.Sprint(time.Time{}.UnixMilli()), fmt.Sprintf("fired %d event=true wm=%d", ms+10000, ms+20000)},
				"x": {fmt.Sprintf("seen wm=%d", ms)},
			})
		})
	}
}

// eventTimeT0 is runEventTime's first record's time.
var eventTimeT0 = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// runEventTime runs job, a function in event time, on a record of key k
// at eventTimeT0 and then one of key x 20 s later, each settled, and
// checks its outputs by key.
func runEventTime(t *testing.T, job sluice.Job, want map[string][]string) {
	t.Helper()
	if !job.EventTime {
		t.Fatal("the job of a function declaring event_time is not in event time")
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("k"), []byte("v"), eventTimeT0)
	h.Settle()
	h.Send([]byte("x"), []byte("v"), eventTimeT0.Add(20*time.Second)) // past k's timer
	h.Settle()
	if got := valuesByKey(h.Output()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}

// A function not declared in event time that sets an event-time timer has
// its key's records dead-lettered, saying why.
func TestEventTimerWithoutEventTimeIsRefused(t *testing.T) {
	url := startGo(t, sdk.Declaration{}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		r.SetEventTimer(c.Now)
		return r
	})
	job := newJob(t, function.Options{URL: url})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("k"), []byte("v"), time.Time{})
	h.Settle()
	dl := h.DeadLetters()
	if len(dl) != 1 || !strings.Contains(header(dl[0], "sluice.error"), "did not declare event_time") {
		t.Fatalf("dead letters %v, want the record's, naming event_time", dl)
	}
}

// An event-time timer the function deletes does not fire.
func TestEventTimerDeleted(t *testing.T) {
	url := startGo(t, sdk.Declaration{EventTime: true}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		for _, e := range c.Events {
			switch {
			case e.Record == nil:
				r.Emit(c.Key, []byte("fired"))
			case string(e.Record.GetValue()) == "cancel": // the timer the record a second before set
				r.DeleteEventTimer(time.UnixMilli(e.Record.GetTimestampMs()).Add(9 * time.Second))
			default:
				r.SetEventTimer(time.UnixMilli(e.Record.GetTimestampMs()).Add(10 * time.Second))
			}
		}
		return r
	})
	h := sluicetest.New(t, newJob(t, function.Options{URL: url}), sluicetest.Options{})
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	h.Send([]byte("k"), []byte("v"), t0)
	h.Send([]byte("kept"), []byte("v"), t0) // its timer is not deleted
	h.Settle()
	h.Send([]byte("k"), []byte("cancel"), t0.Add(time.Second))
	h.Settle()
	h.Send([]byte("x"), []byte("cancel"), t0.Add(20*time.Second)) // past both timers
	h.Settle()
	if got, want := valuesByKey(h.Output()), map[string][]string{"kept": {"fired"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("outputs %q, want %q: k's timer was deleted", got, want)
	}
}

// A batch's answers are computed before it, so an event-time timer that
// its records move the watermark past fires after the batch: its handler
// sees and changes the state the batch left, never one a later answer of
// the batch overwrites. Each record counts in state and sets a timer a
// second on; each timer emits the count and clears it: the emitted counts
// add up to the records, however they are batched. (A timer fired inside
// the batch counted the records before it twice.)
func TestEventTimersFireAfterTheBatch(t *testing.T) {
	var mu sync.Mutex
	most := 0 // the most records of k in one call
	url := startGo(t, sdk.Declaration{EventTime: true, States: []sdk.State{{Name: "n"}}}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		mu.Lock()
		if string(c.Key) == "k" {
			most = max(most, len(c.Events))
		}
		mu.Unlock()
		n, _ := strconv.Atoi(string(c.States["n"]))
		for _, e := range c.Events {
			if e.Record == nil {
				r.Emit(c.Key, []byte(strconv.Itoa(n)))
				n = 0
				continue
			}
			n++
			r.SetEventTimer(time.UnixMilli(e.Record.GetTimestampMs()).Add(time.Second))
		}
		if n == 0 {
			r.Delete("n")
		} else {
			r.Set("n", []byte(strconv.Itoa(n)))
		}
		return r
	})
	h := sluicetest.New(t, newJob(t, function.Options{URL: url}), sluicetest.Options{})
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	h.Send([]byte("k"), []byte("1"), t0) // its timer: t0+1s
	h.Settle()
	// One batch: they wait while no instance runs, and the restarted one
	// polls them together. The first moves the watermark past t0+1s.
	h.Kill()
	h.Send([]byte("k"), []byte("2"), t0.Add(2*time.Second))
	h.Send([]byte("k"), []byte("3"), t0.Add(3*time.Second))
	h.Restart()
	h.Settle()
	h.Send([]byte("x"), []byte("flush"), t0.Add(time.Minute))
	h.Settle()
	sum := 0
	for _, v := range valuesByKey(h.Output())["k"] {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		sum += n
	}
	if sum != 3 {
		t.Fatalf("the timers emitted counts adding up to %d (%q), want the 3 records", sum, valuesByKey(h.Output())["k"])
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 2 {
		t.Fatalf("at most %d of k's records in a call, want 2: the test needs records 2 and 3 in one batch", most)
	}
}

// A burst of due event-time timers fires a poll's worth (MaxPollRecords)
// an iteration, a call each, and all of them fire.
func TestEventTimerBurstIsBounded(t *testing.T) {
	url := startGo(t, sdk.Declaration{EventTime: true}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		for _, e := range c.Events {
			if e.Record == nil {
				r.Emit(c.Key, []byte("fired"))
				continue
			}
			r.SetEventTimer(time.UnixMilli(e.Record.GetTimestampMs()).Add(time.Second))
		}
		return r
	})
	h := sluicetest.New(t, newJob(t, function.Options{URL: url}), sluicetest.Options{
		Configure: func(o *sluice.Options) { o.MaxPollRecords = 2 }})
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := range 7 {
		h.Send(fmt.Appendf(nil, "k%d", i), []byte("v"), t0)
	}
	h.Settle()
	h.Send([]byte("flush"), []byte("v"), t0.Add(time.Minute))
	h.Settle()
	got := valuesByKey(h.Output())
	for i := range 7 {
		if k := fmt.Sprintf("k%d", i); !slices.Equal(got[k], []string{"fired"}) {
			t.Fatalf("%s: outputs %q, want its timer's", k, got[k])
		}
	}
}

// failedEventsRun sends, in one poll, key k's "4", "x", "-1", "y" (two
// values that do not parse, the last of them the key's last record) and
// key z's "bad" alone, then "1" for k in a poll of its own, through the
// aggregate function at url, and checks that exactly the three bad records
// are dead-lettered, each with its reason, and that the others aggregate
// as the built-in job's would: the result applies although the key's last
// record failed.
func failedEventsRun(t *testing.T, url string, o function.Options) {
	t.Helper()
	o.URL = url
	job := newJob(t, o)
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Kill() // the records wait, so that one poll takes them together
	for _, v := range []string{"4", "x", "-1", "y"} {
		h.Send([]byte("k"), []byte(v), time.Time{})
	}
	h.Send([]byte("z"), []byte("bad"), time.Time{})
	h.Restart()
	h.Settle()
	h.Send([]byte("k"), []byte("1"), time.Time{})
	h.Settle()
	want := []string{`{"count":1,"sum":4,"min":4,"max":4}`, `{"count":2,"sum":3,"min":-1,"max":4}`, `{"count":3,"sum":4,"min":-1,"max":4}`}
	if got := values(h.Output()); !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	dl := h.DeadLetters()
	if got := values(dl); !slices.Equal(got, []string{"x", "y", "bad"}) {
		t.Fatalf("dead letters %q, want x, y and bad alone", got)
	}
	for _, r := range dl {
		if e := header(r, "sluice.error"); header(r, "sluice.stage") != "function" || !strings.Contains(e, "the function failed the event: ") || !strings.Contains(e, string(r.Value)) {
			t.Fatalf("dead letter %q: stage %q, error %q; want the function's reason for it", r.Value, header(r, "sluice.stage"), e)
		}
	}
}

// A function fails single records with PARTIAL (the Go SDK's Result.Fail):
// only those go to the dead-letter topic, each with its reason, and the
// rest of the result applies, over each protocol, and with the key's
// records split over calls (Options.Batch 2: the failed events' indices
// are each call's).
func TestFailedEventsDeadLetterOnlyThoseRecords(t *testing.T) {
	var mu sync.Mutex
	most := 0
	url := startGo(t, aggregate.Declaration, func(ctx context.Context, c *sdk.Call) *sdk.Result {
		mu.Lock()
		most = max(most, len(c.Events))
		mu.Unlock()
		return aggregate.Func(ctx, c)
	})
	for _, tc := range []struct {
		name string
		o    function.Options
	}{
		{"json", function.Options{Protocol: function.JSON}},
		{"proto", function.Options{Protocol: function.Proto}},
		{"grpc", function.Options{Protocol: function.GRPC}},
		{"batch of 2", function.Options{Batch: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) { failedEventsRun(t, url, tc.o) })
	}
	if most < 4 {
		t.Fatalf("no call carried k's four records (at most %d): the test tested nothing", most)
	}
}

// The Python SDK's fail, through the example aggregate.
func TestPythonFailedEvents(t *testing.T) {
	failedEventsRun(t, startPython(t, "aggregate.py"), function.Options{})
}

// A PARTIAL result the processor cannot apply fails the whole key, saying
// why: an event listed twice, one out of range, a list without PARTIAL's
// status, and a result that fails every event yet changes state. A timer's
// call that fails its event dead-letters the timer.
func TestInvalidFailedEvents(t *testing.T) {
	url := startGo(t, sdk.Declaration{States: []sdk.State{{Name: "s"}}}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		if c.Events[0].Record == nil {
			return r.Fail(0, "timer refused")
		}
		switch v := string(c.Events[0].Record.GetValue()); v {
		case "twice":
			r.Fail(0, "a").Fail(0, "b")
		case "range":
			r.Fail(len(c.Events), "past the end")
		case "all":
			r.Set("s", []byte("x"))
			r.Fail(0, "every event")
		case "dead":
			r.DeadLetter("the whole key")
			r.Fail(0, "after DeadLetter: does nothing")
		case "timer":
			r.SetTimer(c.Now.Add(time.Minute))
		}
		return r
	})
	job := newJob(t, function.Options{URL: url, Retries: 0})
	h := sluicetest.New(t, job, sluicetest.Options{})
	for _, v := range []string{"twice", "range", "all", "dead", "timer"} {
		h.Send([]byte(v), []byte(v), time.Time{})
		h.Settle()
	}
	h.Advance(2 * time.Minute)
	h.Settle()
	want := map[string]string{
		"twice": "fails event 0 twice",
		"range": "fails event 1 of a call of 1 events",
		"all":   "fails every event of the key and yet changes state",
		"dead":  "the function answered DEAD_LETTER: the whole key",
		"timer": "the function failed the event: timer refused",
	}
	dl := h.DeadLetters()
	if len(dl) != len(want) {
		t.Fatalf("dead letters %q, want one for each of %v", values(dl), slices.Sorted(maps.Keys(want)))
	}
	for _, r := range dl {
		k := string(r.Key)
		if !strings.Contains(header(r, "sluice.error"), want[k]) {
			t.Errorf("dead letter of %s: error %q, want %q", k, header(r, "sluice.error"), want[k])
		}
		if k == "timer" && header(r, "sluice.stage") != "timer" {
			t.Errorf("the timer's dead letter: stage %q, want timer", header(r, "sluice.stage"))
		}
	}
	if out := h.Output(); len(out) != 0 {
		t.Fatalf("outputs %q, want none", values(out))
	}

	// A list with the status OK, from a function speaking JSON by hand.
	raw := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Keys []struct {
				Key string `json:"key"`
			} `json:"keys"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/Describe") {
			io.WriteString(w, `{"protocolVersion":1}`)
			return
		}
		// Key "b2s=" ("ok"): a list with OK; "bmFtZQ==" ("name"):
		// PARTIAL by its name, which this processor reads too.
		status := `"OK"`
		if req.Keys[0].Key == "bmFtZQ==" {
			status = `"PARTIAL"`
		}
		fmt.Fprintf(w, `{"results":[{"key":%q,"status":%s,"failedEvents":[{"index":0,"reason":"r"}]}]}`, req.Keys[0].Key, status)
	}))
	h = sluicetest.New(t, newJob(t, function.Options{URL: raw, Protocol: function.JSON, Retries: 0}), sluicetest.Options{})
	h.Send([]byte("ok"), []byte("v"), time.Time{})
	h.Settle()
	h.Send([]byte("name"), []byte("v"), time.Time{})
	h.Settle()
	dl = h.DeadLetters()
	if len(dl) != 2 || !strings.Contains(header(dl[0], "sluice.error"), "without the status PARTIAL") || !strings.Contains(header(dl[1], "sluice.error"), "the function failed the event: r") {
		t.Fatalf("dead letters %v, want ok's for failed events listed with OK, then name's failed event", dl)
	}
}

// The Go SDK writes enums in JSON as numbers, so that a processor that
// predates PARTIAL fails the key rather than read PARTIAL as OK.
func TestGoSDKWritesPartialAsANumber(t *testing.T) {
	h := sdk.Handler(sdk.Declaration{}, func(_ context.Context, c *sdk.Call) *sdk.Result {
		return (&sdk.Result{}).Fail(0, "bad")
	})
	req := httptest.NewRequest(http.MethodPost, "/sluice.function.v1.FunctionService/Invoke",
		strings.NewReader(`{"keys":[{"key":"aw==","events":[{"record":{"value":"eA=="}}]}]}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `"status":3`) || !strings.Contains(body, `"failedEvents":[{"reason":"bad"}]`) {
		t.Fatalf("answer %d %s, want PARTIAL as 3 and the failed event", rec.Code, body)
	}
}

// A graceful stop while the function answers a timer cuts the call short:
// that timer is left for the next start, and the stop goes on to its final
// checkpoint, which commits the timer that fired before it in the epoch.
// Before, the cut timer stopped the instance (a Fatal timer) without that
// checkpoint: the epoch was aborted and the earlier timer called again
// after the restart. Each timer fires once for good, nothing is
// dead-lettered.
func TestTimerCutShortByTheShutdownFiresAfterTheRestart(t *testing.T) {
	entered := make(chan struct{}, 1)
	var mu sync.Mutex
	calls := map[string]int{} // timer calls by key
	url := startGo(t, sdk.Declaration{}, func(ctx context.Context, c *sdk.Call) *sdk.Result {
		r := &sdk.Result{}
		for _, e := range c.Events {
			if e.Record != nil {
				r.Emit(c.Key, append([]byte("rec:"), e.Record.GetValue()...))
				r.SetTimer(c.Now.Add(time.Minute)) // both keys' at the same time: a fires first
				continue
			}
			mu.Lock()
			calls[string(c.Key)]++
			first := calls[string(c.Key)] == 1
			mu.Unlock()
			if string(c.Key) == "b" && first {
				entered <- struct{}{}
				<-ctx.Done() // held until the processor gives up the call
				return r
			}
			r.Emit(c.Key, append([]byte("fired:"), c.Key...))
		}
		return r
	})
	job := newJob(t, function.Options{URL: url})
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("a"), []byte("x"), time.Time{})
	h.Send([]byte("b"), []byte("y"), time.Time{})
	h.Settle()
	h.Advance(2 * time.Minute)
	select {
	case <-entered: // a's timer answered, b's call in flight, and it stays so
	case <-time.After(time.Minute): // a bound on a hang, not a wait for an event
		t.Fatal("b's timer was not called within a minute")
	}
	h.Restart() // a graceful stop (Run must return nil), then a new instance
	h.Settle()
	got := valuesByKey(h.Output())
	if !slices.Equal(got["a"], []string{"rec:x", "fired:a"}) || !slices.Equal(got["b"], []string{"rec:y", "fired:b"}) {
		t.Fatalf("outputs %q, want each record's and each timer's once", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["a"] != 1 || calls["b"] != 2 {
		t.Fatalf("timer calls %v, want a once (committed by the final checkpoint) and b twice (cut short, then after the restart)", calls)
	}
	if dl := h.DeadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters %q", values(dl))
	}
}

// A function whose event time is a field of its records' JSON values: the
// watermark in its calls and its event-time timers follow that time, not
// the Kafka timestamps (far off here); a record without the field, or not
// JSON, is dead-lettered at the timestamp stage, saying why; over each
// protocol.
func TestEventTimeFromTheValue(t *testing.T) {
	url := startGo(t, sdk.Declaration{EventTime: true, EventTimeSource: pointerSource("/at", functionv1.TimeFormat_UNIX_MILLIS)},
		func(_ context.Context, c *sdk.Call) *sdk.Result {
			r := &sdk.Result{}
			for _, e := range c.Events {
				if e.Record == nil {
					r.Emit(c.Key, fmt.Appendf(nil, "fired %d wm=%d", e.Timer.UnixMilli(), c.Watermark.UnixMilli()))
					continue
				}
				var v struct{ At int64 }
				if err := json.Unmarshal(e.Record.GetValue(), &v); err != nil || e.Record.EventTimeMs == nil || v.At != e.Record.GetEventTimeMs() {
					return r.DeadLetter(fmt.Sprintf("the record %s has event_time_ms %v", e.Record.GetValue(), e.Record.EventTimeMs))
				}
				r.Emit(c.Key, fmt.Appendf(nil, "seen wm=%d", c.Watermark.UnixMilli()))
				r.SetEventTimer(time.UnixMilli(e.Record.GetEventTimeMs()).Add(10 * time.Second))
			}
			return r
		})
	ms := eventTimeT0.UnixMilli()
	kafkaTime := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC) // not the event time
	for _, p := range []function.Protocol{function.JSON, function.GRPC} {
		t.Run(string(p), func(t *testing.T) {
			h := sluicetest.New(t, newJob(t, function.Options{URL: url, Protocol: p}), sluicetest.Options{})
			h.Send([]byte("k"), fmt.Appendf(nil, `{"id":"k","at":%d}`, ms), kafkaTime)
			h.Settle()
			h.Send([]byte("bad"), []byte(`{"id":"bad"}`), kafkaTime)
			h.Send([]byte("bad"), []byte(`not json`), kafkaTime)
			h.Send([]byte("x"), fmt.Appendf(nil, `{"at":%d,"id":"x"}`, ms+20000), kafkaTime) // past k's timer
			h.Send([]byte("x"), []byte(`{"id":"x","at":"soon"}`), kafkaTime)                 // x's answer is still applied
			h.Settle()
			want := map[string][]string{
				"k": {"seen wm=" + fmt.Sprint(time.Time{}.UnixMilli()), fmt.Sprintf("fired %d wm=%d", ms+10000, ms+20000)},
				"x": {fmt.Sprintf("seen wm=%d", ms)},
			}
			if got := valuesByKey(h.Output()); !maps.EqualFunc(got, want, slices.Equal) {
				t.Fatalf("outputs %q, want %q", got, want)
			}
			dl := h.DeadLetters()
			if len(dl) != 3 {
				t.Fatalf("%d dead letters, want the three records without a time", len(dl))
			}
			for i, says := range []string{`event time: "/at": not in the value`, `event time: "/at": the value is not JSON`,
				`event time: "/at" is "soon": want milliseconds since the Unix epoch, an integer`} {
				if header(dl[i], sluice.HeaderStage) != "timestamp" || !strings.Contains(header(dl[i], sluice.HeaderError), says) {
					t.Errorf("dead letter %d: stage %q, error %q; want timestamp, saying %q", i, header(dl[i], sluice.HeaderStage), header(dl[i], sluice.HeaderError), says)
				}
			}
		})
	}
}

// The Python SDK with an event time from a header, in RFC 3339.
func TestPythonEventTimeFromAHeader(t *testing.T) {
	job := newJob(t, function.Options{URL: startPythonAt(t, filepath.Join("testdata", "event_time_header.py"))})
	h := sluicetest.New(t, job, sluicetest.Options{})
	at := func(d time.Duration) sluice.Header {
		return sluice.Header{Key: "at", Value: []byte(eventTimeT0.Add(d).Format(time.RFC3339Nano))}
	}
	kafkaTime := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	h.Send([]byte("k"), []byte("v"), kafkaTime, at(0))
	h.Settle()
	h.Send([]byte("x"), []byte("v"), kafkaTime, at(20*time.Second+500*time.Millisecond))
	h.Settle()
	ms := eventTimeT0.UnixMilli()
	want := map[string][]string{
		"k": {"seen wm=None", fmt.Sprintf("fired %d wm=%d", ms+10000, ms+20500)},
		"x": {fmt.Sprintf("seen wm=%d", ms)},
	}
	if got := valuesByKey(h.Output()); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
}
