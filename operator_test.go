package sluice_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/sluicetest"
)

// offsetsSeen is a task's operator list: the input offsets it processed.
var offsetsSeen = kstate.UnionList("offsets-seen", kstate.Int64())

// Operator state is changelogged and restored like keyed state: after a
// kill and a restart on either backend, each task's list holds exactly the
// offsets it committed, once each.
func TestOperatorStateSurvivesKill(t *testing.T) {
	for _, backend := range []string{"bbolt", "memory"} {
		t.Run(backend, func(t *testing.T) {
			job := sluice.Job{Name: "offsets", Emits: true, States: []string{offsetsSeen.Name()},
				Process: func(ctx sluice.Context, rec *sluice.Record) error {
					if err := offsetsSeen.Add(ctx, rec.Offset); err != nil {
						return err
					}
					vs, err := offsetsSeen.Get(ctx)
					if err != nil {
						return err
					}
					ctx.Emit(rec.Key, []byte(fmt.Sprint(vs)))
					return nil
				}}
			h := sluicetest.New(t, job, sluicetest.Options{Partitions: 1, Backend: backend})
			for i := range 5 {
				h.Send([]byte("k"+strconv.Itoa(i)), nil, time.Time{})
			}
			h.Settle()
			h.Kill()
			h.Restart()
			for i := range 3 {
				h.Send([]byte("after"+strconv.Itoa(i)), nil, time.Time{})
			}
			h.Settle()
			out := h.Output()
			if len(out) != 8 {
				t.Fatalf("%d outputs, want 8", len(out))
			}
			if got := string(out[7].Value); got != "[0 1 2 3 4 5 6 7]" {
				t.Fatalf("last list %s, want every offset once: %v", got, strings.Join(func() []string {
					var s []string
					for _, r := range out {
						s = append(s, string(r.Value))
					}
					return s
				}(), " | "))
			}
		})
	}
}
