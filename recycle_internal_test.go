package sluice

import (
	"context"
	"reflect"
	"testing"

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

// A copy of a task.record record does not put its slot in the pool: the
// slot would then be handed out twice.
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
	if got != r {
		t.Fatal("task.record did not reuse the recycled record")
	}
	if c := got.Context.(*outCtx); !c.explicit || c.task != 2 || c.slot == nil {
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
