package kstate

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
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
