package sluice

import (
	"context"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// recycle takes back only the records task.record made, and lets go of
// what they held; a dead letter's own outCtx, or a marker's explicitCtx,
// stays as it is.
func TestRecycleOnlyTaskRecords(t *testing.T) {
	tk := &task{p: 3}
	r := tk.record(true)
	r.Topic, r.Key, r.Value = "out", []byte("k"), []byte("v")
	if c := r.Context.(*outCtx); !c.explicit || c.task != 3 || c.slot == nil {
		t.Fatalf("task.record's context = %+v", c)
	}
	recycle(r)
	if r.Key != nil || r.Value != nil || r.Topic != "" {
		t.Fatalf("recycled record still holds %q %q %q", r.Topic, r.Key, r.Value)
	}
	dl := &kgo.Record{Topic: "dlq", Key: []byte("k"), Context: &outCtx{Context: context.Background()}}
	marker := &kgo.Record{Topic: "changelog", Key: []byte("m"), Context: explicitCtx}
	recycle(dl)
	recycle(marker)
	if string(dl.Key) != "k" || string(marker.Key) != "m" || dl.Context == nil || marker.Context != explicitCtx {
		t.Fatal("recycle touched a record task.record did not make")
	}
}

// recycle clears a kgo.Record field by field (its Context must not be
// written): a field a franz-go upgrade adds would pass from one record to
// the next unless recycle clears it too.
func TestRecycleClearsEveryRecordField(t *testing.T) {
	if n := reflect.TypeOf(kgo.Record{}).NumField(); n != 12 {
		t.Fatalf("kgo.Record has %d fields, recycle clears 11 and keeps the Context: update recycle", n)
	}
}

// A copy of a task.record record does not put its slot in the free list:
// the slot would then be handed out twice.
func TestRecycleIgnoresCopies(t *testing.T) {
	tk := &task{p: 1}
	r := tk.record(false)
	r.Key = []byte("k")
	cp := *r
	recycle(&cp)
	if string(r.Key) != "k" || string(cp.Key) != "k" {
		t.Fatal("recycle took a copy of a record")
	}
}

// A record whose produce finished is handed out again, by any task, with
// the new task's context: the slots circulate instead of slabs being
// allocated.
func TestRecycledRecordsAreReused(t *testing.T) {
	a, b := &task{p: 1}, &task{p: 2}
	r := a.record(false)
	recycle(r)
	got := b.record(true)
	// A promise of an earlier test's instance may have put a slot after
	// r: then r is among b's spares.
	if got != r && !slices.Contains(b.spare, r.Context.(*outCtx).slot) {
		t.Fatal("task.record did not reuse the recycled record")
	}
	if c := got.Context.(*outCtx); !c.explicit || c.task != 2 || c.slot == nil || &c.slot.rec != got {
		t.Fatalf("reused record's context = %+v", c)
	}
}

// The free list keeps at most maxFreeSlots, and a take moves at most the
// number asked for, the most recently freed first.
func TestSlotListIsBounded(t *testing.T) {
	var l slotList
	slab := make([]outSlot, maxFreeSlots+10)
	for i := range slab {
		l.put(&slab[i])
	}
	got := l.take(nil, 10)
	if len(got) != 10 || got[9] != &slab[maxFreeSlots-1] {
		t.Fatalf("took %d slots, want the last 10 kept", len(got))
	}
	got = l.take(got[:0], 2*maxFreeSlots)
	if len(got) != maxFreeSlots-10 || got[0] != &slab[0] {
		t.Fatalf("took %d slots, want the other %d", len(got), maxFreeSlots-10)
	}
	if again := l.take(nil, 1); len(again) != 0 {
		t.Fatalf("took %d slots from an empty list", len(again))
	}
}

// putAll keeps the free list's bound as put does, whole batches or the part
// that fits.
func TestSlotListPutAllIsBounded(t *testing.T) {
	var l slotList
	slab := make([]outSlot, maxFreeSlots+10)
	batch := make([]*outSlot, 0, slabLen)
	for i := range slab {
		batch = append(batch, &slab[i])
		if len(batch) == slabLen || i == len(slab)-1 {
			l.putAll(batch)
			batch = batch[:0]
		}
	}
	if len(l.free) != maxFreeSlots || l.free[maxFreeSlots-1] != &slab[maxFreeSlots-1] {
		t.Fatalf("%d slots kept, want the first %d", len(l.free), maxFreeSlots)
	}
}

// The promises of a session's client hand their slots to the free list a
// slab's worth at a time: none before, all of them then.
func TestPromisesFreeASlabOfSlotsAtOnce(t *testing.T) {
	// A list of the test's own, which no other test's instance takes
	// from or fills.
	l := &loop{slots: &slotList{}}
	tk := &task{p: 1}
	recs := make([]*kgo.Record, slabLen)
	for i := range recs {
		recs[i] = tk.record(false)
		recs[i].Key = []byte("k")
	}
	inFreeList := func(s *outSlot) bool {
		l.slots.mu.Lock()
		defer l.slots.mu.Unlock()
		return slices.Contains(l.slots.free, s)
	}
	for _, r := range recs[:slabLen-1] {
		l.plainPromised(r, nil)
		if r.Key != nil {
			t.Fatal("a promise left its record's key")
		}
	}
	first := recs[0].Context.(*outCtx).slot
	if len(l.freed) != slabLen-1 || inFreeList(first) {
		t.Fatalf("%d slots waiting, want %d and none in the free list yet", len(l.freed), slabLen-1)
	}
	l.outPromised(recs[slabLen-1], nil)
	if len(l.freed) != 0 || !inFreeList(first) || !inFreeList(recs[slabLen-1].Context.(*outCtx).slot) {
		t.Fatalf("%d slots waiting after a slab's worth, want them all in the free list", len(l.freed))
	}
}

// A trim drops the slots that were free at the trim before and that no
// take has reached since: those a burst left behind.
func TestSlotListTrimsWhatIsNotTaken(t *testing.T) {
	var l slotList
	slab := make([]outSlot, 10)
	for i := range 6 {
		l.put(&slab[i])
	}
	l.trim() // the first: nothing was free before it
	if len(l.free) != 6 {
		t.Fatalf("%d free after the first trim, want 6", len(l.free))
	}
	l.take(nil, 2) // reaches 2 of the 6: 4 were not needed
	for i := 6; i < 10; i++ {
		l.put(&slab[i])
	}
	l.trim()
	if len(l.free) != 4 || l.free[0] != &slab[6] {
		t.Fatalf("%d free after the second trim, want the 4 put since", len(l.free))
	}
	l.trim() // nothing taken since: all go
	if len(l.free) != 0 {
		t.Fatalf("%d free after a trim with no take since the one before, want 0", len(l.free))
	}
}

// outSlots is trimmed at every garbage collection: slots put back and not
// taken again are let go after two.
func TestOutSlotsAreTrimmedByTheCollector(t *testing.T) {
	mine := newSlots(nil)
	for _, s := range mine {
		outSlots.put(s)
	}
	held := func() bool {
		outSlots.mu.Lock()
		defer outSlots.mu.Unlock()
		for _, s := range outSlots.free {
			if slices.Contains(mine, s) {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(30 * time.Second)
	for held() {
		if time.Now().After(deadline) {
			t.Fatal("the free list still held the slots after 30 s of garbage collections")
		}
		runtime.GC()                        // the cleanup that trims runs after it, on a goroutine of its own
		<-time.After(10 * time.Millisecond) // polling a condition, with a deadline
	}
}
