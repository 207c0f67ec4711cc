package sluice

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/internal/testhook"
	"github.com/sluicehq/sluice/kstate"
)

// What a test harness (sluicetest) needs from a running instance, and
// nothing a user of package sluice can reach: unexported, handed to
// sluicetest through internal/testhook.

func init() {
	testhook.Kill = func(in any) { kill(in.(*Instance)) }
	testhook.Quiet = func(ctx context.Context, in any) (bool, error) { return quiet(ctx, in.(*Instance)) }
}

// errKilled ends a session that kill stopped.
var errKilled = errors.New("sluice: killed")

// kill stops in as a crash would, at its loop's next iteration: no final
// checkpoint, no leaving the group, the open epoch's transaction left to
// the broker (the next instance with the same id fences it). Run then
// returns nil.
func kill(in *Instance) {
	in.killed.Store(true)
	in.wakeLoop()
}

// quiet reports whether in has nothing in flight: it is in its group and
// has received the session's first assignment, every assigned task is restored and
// running, no epoch is open, and no timer is due by its clock or
// watermark. Together with group offsets committed up to
// the inputs' ends, it says that everything sent so far has committed.
// The last epoch's writes to the tasks' backends have returned too, so a
// query (Instance.Query) reads everything committed; the loop may not have
// settled them yet (kstate.Store.Behind), which changes nothing a query or
// Kafka sees. The loop answers between iterations; ctx bounds the wait.
func quiet(ctx context.Context, in *Instance) (bool, error) {
	reply := make(chan bool, 1)
	select {
	case in.probes <- reply:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	in.wakeLoop()
	select {
	case q := <-reply:
		return q, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// answerProbes answers the Quiet calls waiting for the loop.
func (l *loop) answerProbes() {
	for {
		select {
		case reply := <-l.in.probes:
			reply <- l.isQuiet()
		default:
			return
		}
	}
}

func (l *loop) isQuiet() bool {
	if !l.assigned || len(l.restoring) > 0 || !l.joined() || l.inTxn.Load() || l.coord.Phase() != barrier.Processing {
		return false
	}
	if b := l.behind; b != nil {
		select {
		case <-b.done:
		default:
			return false // a backend's write is under way
		}
	}
	now := l.in.clock.Now().UnixMilli()
	if _, wall := l.in.clock.(wallClock); !wall {
		l.in.queries.now.Store(now) // what a query after Settle judges TTLs by
	}
	for _, t := range l.tasks {
		if t.store.DirtyLen() > 0 || t.advanced || len(t.orphans) > 0 || t.timers.next[kstate.ProcessingTime] <= now {
			return false
		}
		if t.clock != nil && t.clock.wm != noTime && t.clock.wm >= t.timers.next[kstate.EventTime] {
			return false
		}
	}
	return true
}
