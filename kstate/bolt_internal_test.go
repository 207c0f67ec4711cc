package kstate

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// A second open of a locked file (a zombie still holding it) must fail with
// ErrLocked after the timeout rather than hang.
func TestOpenBoltLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nested", "t.db")
	first, err := openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := openBolt(path, 20*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open = %v, want ErrLocked", err)
	}
}

func TestPrepareMutations(t *testing.T) {
	muts := []Mutation{
		{Key: []byte("b"), Value: []byte("1")},
		{Key: []byte("a"), Value: []byte("1")},
		{Key: []byte("b"), Value: nil},
		{Key: []byte("c"), Value: []byte("1")},
		{Key: []byte("b"), Value: []byte("3")},
		{Key: []byte("a"), Value: nil},
	}
	got, err := prepareMutations(muts)
	if err != nil {
		t.Fatal(err)
	}
	want := []Mutation{{Key: []byte("a")}, {Key: []byte("b"), Value: []byte("3")}, {Key: []byte("c"), Value: []byte("1")}}
	if len(got) != len(want) {
		t.Fatalf("got %d mutations, want %d", len(got), len(want))
	}
	for i := range want {
		if string(got[i].Key) != string(want[i].Key) || string(got[i].Value) != string(want[i].Value) || (got[i].Value == nil) != (want[i].Value == nil) {
			t.Errorf("mutation %d = %q:%q, want %q:%q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
		}
	}
}

// A file whose stats were written before timers were counted gets them
// counted once at open.
func TestBoltCountsTimersOfOlderStats(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	b, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	ev := TimerKey(Timer{Domain: EventTime, At: time.Unix(5, 0), Key: []byte("k")})
	pt := TimerKey(Timer{Domain: ProcessingTime, At: time.Unix(5, 0), Key: []byte("k")})
	if err := b.Apply([]Mutation{{Key: ev, Value: []byte{}}, {Key: pt, Value: []byte{}}, {Key: []byte("x"), Value: []byte("1")}}, Meta{}); err != nil {
		t.Fatal(err)
	}
	bb := b.(*boltBackend)
	older := binary.AppendUvarint(binary.AppendUvarint(nil, 3), uint64(bb.stats.Bytes))
	if err := bb.update(func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(statsKey, older) }); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err = OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if s := b.Stats(); s.Keys != 3 || s.EventTimers != 1 || s.ProcessingTimers != 1 {
		t.Fatalf("Stats after reopening older stats = %+v", s)
	}
}
