package sluice_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

var timerRuns = kstate.Value("timer-runs", kstate.String())

// A graceful stop cuts a processing-time timer's handler short: the
// handler has written state and emitted, then its call fails with the
// shutdown's cancellation. Those writes and outputs are dropped, the timer
// stays for the next start, and the final checkpoint commits the timer
// that fired before it in the epoch; after the restart the cut timer fires
// once more. Each key's outputs and state are its one committed firing's.
func TestTimerCutShortByTheShutdownIsLeftForTheNextStart(t *testing.T) {
	entered := make(chan struct{}, 1)
	var mu sync.Mutex
	calls := map[string]int{}
	job := sluice.Job{Name: "cut-timer", Emits: true, States: []string{timerRuns.Name()},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			ctx.Emit(rec.Key, append([]byte("rec:"), rec.Value...))
			ctx.Timers().RegisterProcessingTime(ctx.Now().Add(time.Minute)) // a's and b's at the same time: a fires first
			return nil
		},
		OnTimer: func(ctx sluice.Context, tm sluice.Timer) error {
			mu.Lock()
			calls[string(tm.Key)]++
			n := calls[string(tm.Key)]
			mu.Unlock()
			if err := timerRuns.Set(ctx, fmt.Sprintf("run %d", n)); err != nil {
				return err
			}
			ctx.Emit(tm.Key, fmt.Appendf(nil, "fired:%s:%d", tm.Key, n))
			if string(tm.Key) == "b" && n == 1 {
				entered <- struct{}{}
				<-ctx.Context().Done() // a call the shutdown cuts short
				return fmt.Errorf("calling the service: %w", ctx.Context().Err())
			}
			return nil
		},
	}
	h := sluicetest.New(t, job, sluicetest.Options{})
	h.Send([]byte("a"), []byte("x"), time.Time{})
	h.Send([]byte("b"), []byte("y"), time.Time{})
	h.Settle()
	h.Advance(2 * time.Minute)
	select {
	case <-entered: // a's timer handled, b's handler waiting for the shutdown
	case <-time.After(time.Minute): // a bound on a hang, not a wait for an event
		t.Fatal("b's timer did not fire within a minute")
	}
	h.Restart()
	h.Settle()
	got := map[string][]string{}
	for _, r := range h.Output() {
		got[string(r.Key)] = append(got[string(r.Key)], string(r.Value))
	}
	if !slices.Equal(got["a"], []string{"rec:x", "fired:a:1"}) || !slices.Equal(got["b"], []string{"rec:y", "fired:b:2"}) {
		t.Fatalf("outputs %q: want a's first firing (committed by the final checkpoint) and b's second, each once", got)
	}
	for key, want := range map[string]string{"a": "run 1", "b": "run 2"} {
		h.Query([]byte(key), func(s kstate.Scope) error {
			if v, _, err := timerRuns.Get(s); err != nil || v != want {
				return fmt.Errorf("key %s: state %q (%v), want %q", key, v, err, want)
			}
			return nil
		})
	}
	if dl := h.DeadLetters(); len(dl) != 0 {
		t.Fatalf("dead letters: %d", len(dl))
	}
}
