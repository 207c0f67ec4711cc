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
