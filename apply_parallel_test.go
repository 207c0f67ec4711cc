package sluice_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/jobs"
	"github.com/sluicehq/sluice/kstate"
)

// overlapBackend counts the Applies of its group's backends in progress at
// once. An Apply that is alone waits (up to 10 s, once per test) for
// another to join it, so that applies run in parallel are seen to.
type overlapBackend struct {
	kstate.Backend
	o    *overlap
	fail bool // Apply fails, after the wait
}

type overlap struct {
	mu     sync.Mutex
	active int
	most   int
	joined chan struct{} // closed once two Applies were in progress at once
	gaveUp bool
}

func (b overlapBackend) Apply(muts []kstate.Mutation, meta kstate.Meta) error {
	o := b.o
	o.mu.Lock()
	o.active++
	o.most = max(o.most, o.active)
	if o.active == 2 && !o.gaveUp {
		close(o.joined)
		o.gaveUp = true // closed: nothing else waits
	}
	wait := !o.gaveUp
	o.mu.Unlock()
	if wait {
		select {
		case <-o.joined:
		case <-time.After(10 * time.Second): // applied one at a time
			o.mu.Lock()
			o.gaveUp = true
			o.mu.Unlock()
		}
	}
	defer func() { o.mu.Lock(); o.active--; o.mu.Unlock() }()
	if b.fail {
		return errors.New("disk on fire")
	}
	return b.Backend.Apply(muts, meta)
}

// An epoch is applied to its tasks' stores at once, not one after another,
// and every task's state is then the same as applied alone: the aggregate
// of each key, read back from the files after the instance stopped.
func TestEpochAppliesTasksInParallel(t *testing.T) {
	const keys, perKey = 40, 25
	var recs []*kgo.Record
	for i := range keys * perKey {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("k%02d", i%keys)), Value: []byte(fmt.Sprint(i))})
	}
	brokers, adm := inputCluster(t, 4, recs)
	o := &overlap{joined: make(chan struct{})}
	state := filepath.Join(t.TempDir(), "s")
	opts := testOptions(brokers, "par-apply", jobs.Aggregate(), state)
	opts.OutputTopic = "out"
	opts.OpenBackend = func(kind, dir, task string) (kstate.Backend, error) {
		be, err := kstate.Open(kind, dir, task)
		if err != nil {
			return nil, err
		}
		return overlapBackend{Backend: be, o: o}, nil
	}
	runUntil(t, opts, consumedAll(adm, "par-apply", keys*perKey))
	if o.most < 2 {
		t.Fatalf("at most %d task applied an epoch at a time; want them in parallel", o.most)
	}
	// Each key's count and sum, from the task files.
	files, err := filepath.Glob(filepath.Join(state, "par-apply", "task-*.db"))
	if err != nil || len(files) != 4 {
		t.Fatalf("task files %v (%v), want 4", files, err)
	}
	got := map[string]string{}
	for _, f := range files {
		be, err := kstate.OpenBolt(f)
		if err != nil {
			t.Fatal(err)
		}
		err = be.Scan(nil, func(k, v []byte) error {
			if len(v) == 32 && len(k) >= 3 {
				got[string(k[len(k)-3:])] = fmt.Sprintf("%x", v[:16]) // the user key: count and sum
			}
			return nil
		})
		be.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != keys {
		t.Fatalf("%d aggregations in the task files, want %d", len(got), keys)
	}
	for i := range keys {
		var sum int
		for j := range perKey {
			sum += i + j*keys
		}
		k := fmt.Sprintf("k%02d", i)
		if want := fmt.Sprintf("%016x%016x", perKey, sum); got[k] != want {
			t.Errorf("key %q: count and sum %s, want %s", k, got[k], want)
		}
	}
}

// A task whose apply fails stops the instance with that error, whatever
// the other tasks' applies did alongside it.
func TestParallelApplyFailureStopsTheInstance(t *testing.T) {
	var recs []*kgo.Record
	for i := range 400 {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i%40)), Value: []byte("1")})
	}
	brokers, _ := inputCluster(t, 4, recs)
	o := &overlap{gaveUp: true} // no waiting for a partner
	opts := testOptions(brokers, "par-fail", jobs.Aggregate(), filepath.Join(t.TempDir(), "s"))
	opts.OutputTopic = "out"
	opts.OpenBackend = func(kind, dir, task string) (kstate.Backend, error) {
		be, err := kstate.Open(kind, dir, task)
		if err != nil {
			return nil, err
		}
		return overlapBackend{Backend: be, o: o, fail: task == "task-0002"}, nil
	}
	inst, err := sluice.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- inst.Run(t.Context()) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the instance did not stop within a minute of a failed apply")
	}
	if err == nil || !strings.Contains(err.Error(), "disk on fire") || !strings.Contains(err.Error(), "task 2") {
		t.Fatalf("Run = %v, want task 2's apply error", err)
	}
}
