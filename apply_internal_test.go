package sluice

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/kstate"
)

// pairedBackend is a memory backend whose first Apply of the group waits
// (up to 10 s) for a second to begin, and whose Apply fails with fail.
type pairedBackend struct {
	kstate.Backend
	pair *pairing
	fail error
}

type pairing struct {
	mu     sync.Mutex
	in     int
	paired bool
	both   chan struct{}
	gate   chan struct{} // if set, every Apply waits for it to close
}

func (b pairedBackend) Apply(muts []kstate.Mutation, meta kstate.Meta) error {
	p := b.pair
	p.mu.Lock()
	p.in++
	first := p.in == 1
	if p.in == 2 {
		close(p.both)
	}
	p.mu.Unlock()
	if first {
		// The first waits for a second to begin while it is still in
		// here; written one at a time, none does.
		select {
		case <-p.both:
			p.mu.Lock()
			p.paired = true
			p.mu.Unlock()
		case <-time.After(10 * time.Second):
		}
	}
	if p.gate != nil {
		<-p.gate
	}
	if b.fail != nil {
		return b.fail
	}
	// Read the offsets as bbolt's meta encoder does: the memory
	// backend's maps.Clone is not seen by the race detector.
	for range meta.Offsets {
	}
	return b.Backend.Apply(muts, meta)
}

// racyClock is a processing-time clock that is not safe for concurrent
// use, as Options.Clock need not be with Parallelism 1: the race detector
// reports it if the apply reads it from more than one goroutine.
type racyClock struct{ n int64 }

func (c *racyClock) Now() time.Time { c.n++; return time.UnixMilli(1_700_000_000_000 + c.n) }

// applyFixture is a loop with four tasks of an event-time job, each with
// one key written and a marker, as after a committed epoch; task failing
// has a backend whose Apply fails.
func applyFixture(t *testing.T, failing int32) (*loop, map[int32]kstate.Backend, *pairing) {
	t.Helper()
	in := &Instance{cfg: Options{InputTopics: []string{"in"}, Job: Job{Name: "j", EventTime: true}}, clock: &racyClock{}, batchMax: 1 << 20}
	in.m, _ = newMetrics(in)
	l := &loop{in: in, tasks: map[int32]*task{}}
	pair := &pairing{both: make(chan struct{})}
	inner := map[int32]kstate.Backend{}
	for p := range int32(4) {
		inner[p] = kstate.NewMemory()
		be := pairedBackend{Backend: inner[p], pair: pair}
		if p == failing {
			be.fail = errors.New("disk on fire")
		}
		tk, err := newTask(in, p, be, kstate.Meta{})
		if err != nil {
			t.Fatal(err)
		}
		tk.clock.observe("in", time.UnixMilli(1_700_000_000_000), in.clock.Now()) // a watermark: publishTime reads the clock
		tk.store.Put([]byte(fmt.Sprintf("k%d", p)), []byte("v"))
		tk.store.CommitRecord()
		tk.next["in"] = int64(10 + p)
		tk.advanced = true
		tk.dirty = tk.store.Dirty()
		tk.marker = &kgo.Record{Offset: int64(100 + p)}
		l.tasks[p] = tk
	}
	return l, inner, pair
}

// An epoch's backend transactions run at once (two meet inside Apply,
// which tasks applied one after another never do), behind the loop:
// applyTasks returns with the tasks moved to the epoch and their stores
// reading it, and once settled each backend has its key and its meta.
// The rest of the apply reads the job's clock on the loop goroutine only
// (racyClock, under the race detector).
func TestApplyTasksWritesBackendsAtOnce(t *testing.T) {
	l, inner, pair := applyFixture(t, -1)
	pair.gate = make(chan struct{})
	if err := l.applyTasks([]int32{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	// The writes are held: applyTasks returned all the same, and
	// nothing is counted applied until they end.
	if err := l.settleApply(false); err != nil || l.behind == nil || l.in.committedEpochs.Load() != 0 {
		t.Fatalf("settleApply(false) = %v with the writes held (behind %v, %d epochs applied), want nil, still behind, 0", err, l.behind != nil, l.in.committedEpochs.Load())
	}
	for p, tk := range l.tasks {
		if !tk.store.Behind() {
			t.Errorf("task %d: not behind while its write is held", p)
		}
		if _, ok, _ := inner[p].Get([]byte(fmt.Sprintf("k%d", p))); ok {
			t.Errorf("task %d: the backend has the key while its write is held", p)
		}
		if v, ok, err := tk.store.Get([]byte(fmt.Sprintf("k%d", p))); err != nil || !ok || string(v) != "v" {
			t.Errorf("task %d: store reads %q %v %v during the write, want the epoch's value", p, v, ok, err)
		}
		if tk.store.DirtyLen() != 0 {
			t.Errorf("task %d: the next epoch starts with %d keys changed", p, tk.store.DirtyLen())
		}
		// What take does with the first record of a topic new to the
		// task, while the write may still read the epoch's meta: the
		// race detector reports it if the two share the offsets.
		tk.committed["in2"] = 0
	}
	close(pair.gate)
	if err := l.settleApply(true); err != nil {
		t.Fatal(err)
	}
	if !pair.paired {
		t.Fatal("no two backends were written at once")
	}
	if l.in.committedEpochs.Load() != 1 {
		t.Errorf("%d epochs counted applied, want 1", l.in.committedEpochs.Load())
	}
	for p, be := range inner {
		tk := l.tasks[p]
		if _, ok, _ := be.Get([]byte(fmt.Sprintf("k%d", p))); !ok {
			t.Errorf("task %d: key not applied", p)
		}
		m, err := be.Meta()
		if err != nil || m.Epoch != 1 || m.Offsets["in"] != int64(10+p) || m.ChangelogOffset != int64(101+p) {
			t.Errorf("task %d: meta %+v (%v), want epoch 1 at offset %d, changelog %d", p, m, err, 10+p, 101+p)
		}
		if tk.epoch != 1 || tk.committed["in"] != int64(10+p) || tk.marker != nil || tk.advanced || tk.store.Behind() {
			t.Errorf("task %d: epoch %d, committed %v, marker %v, behind %v: not moved to the epoch", p, tk.epoch, tk.committed, tk.marker, tk.store.Behind())
		}
	}
}

// A task whose backend refuses the epoch makes settleApply return its
// error, and counts no epoch applied; the others, written alongside it,
// hold the epoch. The failing one's file stays at the epoch before (which
// a restart brings forward from the changelog), its store still reads the
// epoch, and its next apply fails too.
func TestApplyTasksFailureLeavesTheOthersApplied(t *testing.T) {
	l, inner, _ := applyFixture(t, 1)
	if err := l.applyTasks([]int32{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	err := l.settleApply(true)
	if err == nil || !strings.Contains(err.Error(), "task 1: apply epoch 1") || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("settleApply = %v, want task 1's error", err)
	}
	if l.in.committedEpochs.Load() != 0 {
		t.Errorf("%d epochs counted applied, want 0", l.in.committedEpochs.Load())
	}
	for p, be := range inner {
		m, _ := be.Meta()
		want := uint64(1)
		if p == 1 {
			want = 0
		}
		if m.Epoch != want {
			t.Errorf("task %d: backend at epoch %d, want %d", p, m.Epoch, want)
		}
		if v, ok, err := l.tasks[p].store.Get([]byte(fmt.Sprintf("k%d", p))); err != nil || !ok || string(v) != "v" {
			t.Errorf("task %d: store reads %q %v %v, want the epoch's value", p, v, ok, err)
		}
	}
	tk := l.tasks[1]
	tk.store.Put([]byte("k9"), []byte("w"))
	tk.store.CommitRecord()
	tk.dirty, tk.marker = tk.store.Dirty(), &kgo.Record{Offset: 200}
	if err := l.applyTasks([]int32{1}); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("the next apply of task 1 = %v, want the earlier write's error", err)
	}
}
