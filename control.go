package sluice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/control"
)

// Stop requests (`processor savepoint --stop`) reach every instance through
// the app's control topic (internal/control). An instance follows it from
// the start: while the app is stopped it does not join the group (not
// ready); once it runs, a stop request ends it as a shutdown does — a final
// checkpoint, then it leaves the group, even with StayInGroupOnShutdown, so
// the stopping tool sees the group empty — and Run returns nil.
//
// Ordering rule: the control topic is read to the end it had when the
// instance started before the instance first joins, so an instance started
// after a stop request cannot take partitions and commit past the cut the
// savepoint is about to record.

// ensureControl creates the control topic when it is missing, and reports
// whether the instance can follow it.
func (in *Instance) ensureControl(ctx context.Context) (bool, error) {
	topic := in.controlTopic()
	have, err := in.adm.ListTopics(ctx)
	if err != nil {
		return false, err
	}
	if d, ok := have[topic]; ok && d.Err == nil {
		return true, nil
	}
	if in.cfg.DisableTopicCreation {
		in.log.Warn("no control topic and topic creation is off: stop requests (processor savepoint --stop) are not followed", "topic", topic)
		return false, nil
	}
	return true, control.Create(ctx, in.adm, in.controlApp())
}

// controlApp is the app whose control topic the instance follows: its own,
// or for a pipeline's stage the pipeline's.
func (in *Instance) controlApp() string {
	if in.cfg.controlApp != "" {
		return in.cfg.controlApp
	}
	return in.cfg.AppID
}

func (in *Instance) controlTopic() string { return control.TopicName(in.controlApp()) }

// controlFollower follows the control topic in a goroutine of its own.
type controlFollower struct {
	log *slog.Logger
	cl  *kgo.Client
	end int64 // the partition's end when the instance started

	mu       sync.Mutex
	state    control.State // the last state read; zero is running
	caughtUp bool          // read up to end
	changed  chan struct{} // closed, and replaced, at every change
	done     chan struct{} // closed when the goroutine ends
}

// followControl starts following the control topic; without one (see
// ensureControl) the app always runs.
func (in *Instance) followControl(ctx context.Context) (*controlFollower, error) {
	f := &controlFollower{log: in.log, changed: make(chan struct{}), done: make(chan struct{})}
	if !in.hasControl {
		f.caughtUp = true
		close(f.done)
		return f, nil
	}
	topic := in.controlTopic()
	ends, err := in.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("control topic %s: %w", topic, err)
	}
	o, ok := ends.Lookup(topic, 0)
	if !ok || o.Err != nil {
		return nil, fmt.Errorf("control topic %s: end offset: %v", topic, o.Err)
	}
	f.end = o.Offset
	f.caughtUp = f.end == 0
	f.cl, err = kgo.NewClient(append(in.baseOpts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxWait(250*time.Millisecond),
	)...)
	if err != nil {
		return nil, err
	}
	go f.run(ctx)
	return f, nil
}

func (f *controlFollower) run(ctx context.Context) {
	defer close(f.done)
	for {
		fs := f.cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		fs.EachError(func(topic string, p int32, err error) {
			f.log.Warn("reading the control topic failed; retrying", "topic", topic, "err", err)
		})
		fs.EachRecord(func(r *kgo.Record) {
			var s control.State
			err := errOtherRecord // a pipeline's record of its stages
			if bytes.Equal(r.Key, control.StateKey) {
				if s, err = control.Decode(r.Value); err != nil {
					f.log.Warn("control record ignored: it does not decode", "offset", r.Offset, "err", err)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if err == nil && s != f.state {
				f.state = s
				f.notify()
			}
			if !f.caughtUp && r.Offset+1 >= f.end {
				f.caughtUp = true
				f.notify()
			}
		})
	}
}

// errOtherRecord marks a control record that is not a state.
var errOtherRecord = errors.New("not a state record")

// notify wakes the waiters; f.mu is held.
func (f *controlFollower) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *controlFollower) close() {
	if f.cl != nil {
		f.cl.Close()
	}
	<-f.done
}

// await waits until the follower has caught up and stopped says what the
// caller waits for; it returns ctx's error if ctx ends first.
func (f *controlFollower) await(ctx context.Context, stopped bool, waiting func(control.State)) error {
	told := false
	for {
		f.mu.Lock()
		caught, s, ch := f.caughtUp, f.state, f.changed
		f.mu.Unlock()
		if caught && (s.State == control.Stopped) == stopped {
			return nil
		}
		if caught && !told && waiting != nil {
			waiting(s)
			told = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}
