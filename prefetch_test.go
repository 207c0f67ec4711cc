package sluice_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

// prefetchProbe is a job whose Prefetch records what it was given and
// checks the engine's promises; Process counts per key in state.
type prefetchProbe struct {
	mu          sync.Mutex
	processed   map[int64]bool
	unavailable int // Prefetch answers UnavailableError this many more times
	calls       int
	bad         []string // violations of the promises
}

var prefetchCount = kstate.Value[int64]("count", kstate.Int64())

func (p *prefetchProbe) job() sluice.Job {
	return sluice.Job{
		Name:  "prefetch-probe",
		Emits: true,
		Prefetch: func(ctx sluice.PrefetchContext, recs []*sluice.Record) error {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.calls++
			for i, r := range recs {
				if p.processed[r.Offset] {
					p.bad = append(p.bad, fmt.Sprintf("offset %d was given to Prefetch after it was processed", r.Offset))
				}
				if i > 0 && r.Offset <= recs[i-1].Offset {
					p.bad = append(p.bad, "records out of partition order")
				}
			}
			// Reads see the state before the batch; a write is dropped.
			ctx.Store().Put([]byte("prefetch-wrote"), []byte("x"))
			if p.unavailable > 0 {
				p.unavailable--
				return &sluice.UnavailableError{Err: errors.New("connection refused")}
			}
			return nil
		},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			p.mu.Lock()
			p.processed[rec.Offset] = true
			p.mu.Unlock()
			if _, ok, _ := ctx.Store().Get([]byte("prefetch-wrote")); ok {
				return sluice.Fatal(errors.New("a write of Prefetch is visible to Process"))
			}
			if string(rec.Value) == "bad" {
				return &sluice.StageError{Stage: "remote", Err: errors.New("refused")}
			}
			n, _, err := prefetchCount.Get(ctx)
			if err != nil {
				return err
			}
			if err := prefetchCount.Set(ctx, n+1); err != nil {
				return err
			}
			ctx.Emit(rec.Key, fmt.Appendf(nil, "%s:%d", rec.Key, n+1))
			return nil
		},
	}
}

// Job.Prefetch sees each batch before any of its records is processed; an
// UnavailableError rewinds the batch, which comes again (nothing of it is
// processed meanwhile, nothing lost or repeated); a StageError names the
// dead letter's stage.
func TestPrefetch(t *testing.T) {
	p := &prefetchProbe{processed: map[int64]bool{}, unavailable: 3}
	h := sluicetest.New(t, p.job(), sluicetest.Options{})
	for _, v := range []string{"1", "2", "bad", "3"} {
		h.Send([]byte("k"), []byte(v), time.Time{})
	}
	h.Settle()
	want := []string{"k:1", "k:2", "k:3"}
	var got []string
	for _, r := range h.Output() {
		got = append(got, string(r.Value))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("outputs %q, want %q", got, want)
	}
	dl := h.DeadLetters()
	if len(dl) != 1 || string(dl[0].Value) != "bad" {
		t.Fatalf("dead letters: %v", dl)
	}
	for _, hd := range dl[0].Headers {
		if hd.Key == sluice.HeaderStage && string(hd.Value) != "remote" {
			t.Fatalf("dead letter stage %q, want remote", hd.Value)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bad) > 0 {
		t.Fatal(p.bad)
	}
	if p.unavailable != 0 || p.calls < 4 {
		t.Fatalf("Prefetch called %d times, %d unavailable answers left: want the batch to come again after each", p.calls, p.unavailable)
	}
}
