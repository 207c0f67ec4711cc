package changelog

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// LastMarker finds the last committed marker and does not wait for an open
// transaction, whose marker it does not count.
func TestLastMarker(t *testing.T) {
	c, _, adm := changelogWith(t, 3, 5, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	got, err := LastMarker(ctx, adm, opts, "app-changelog", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Marker == nil || got.Marker.Epoch != 3 || got.Marker.Offsets["in"] != 30 || got.Offset < 0 {
		t.Fatalf("LastMarker: %+v", got)
	}
	committed := got

	// A transaction left open with a later marker in it.
	txn, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("zombie"), kgo.DefaultProduceTopic("app-changelog"))
	if err != nil {
		t.Fatal(err)
	}
	defer txn.Close()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Key: MarkerKey, Value: EncodeMarker(Marker{Epoch: 4, Offsets: map[string]int64{"in": 40}})}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got, err = LastMarker(ctx, adm, opts, "app-changelog", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Marker == nil || got.Marker.Epoch != 3 || got.Offset != committed.Offset || got.LastStable != committed.LastStable {
		t.Fatalf("with an open transaction: %+v, want the committed marker %+v", got, committed)
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	got, err = LastMarker(ctx, adm, opts, "app-changelog", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Marker == nil || got.Marker.Epoch != 4 || got.Offset <= committed.Offset {
		t.Fatalf("after the commit: %+v", got)
	}
}

func TestLastMarkerOfEmptyPartition(t *testing.T) {
	c, _, adm := changelogWith(t, 0, 0, 0)
	got, err := LastMarker(context.Background(), adm, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, "app-changelog", 0)
	if err != nil || got.Marker != nil || got.Offset != -1 {
		t.Fatalf("LastMarker: %+v, %v", got, err)
	}
}
