package sluice

import (
	"context"
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
