package kstate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
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
	if err := bb.update(true, func(tx *bolt.Tx) error { return tx.Bucket(metaBucket).Put(statsKey, older) }); err != nil {
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

// Point reads share a read transaction across Applies: a read after an
// Apply must see it, and an Apply that grows the file (bbolt remaps it)
// must not wait for the shared transaction, from this goroutine or while
// other goroutines read.
func TestBoltSharedReadsSeeEveryApply(t *testing.T) {
	b, err := openBolt(filepath.Join(t.TempDir(), "t.db"), DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	key := []byte("k")
	stop := make(chan struct{})
	done := make(chan error)
	go func() { // a reader on another goroutine: values only ever grow
		var last uint64
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			v, ok, err := b.Get(key)
			if err != nil {
				done <- err
				return
			}
			if ok {
				n := binary.BigEndian.Uint64(v)
				if n < last {
					done <- errors.New("a read went back in time")
					return
				}
				last = n
			}
		}
	}()
	filler := make([]byte, 64<<10)
	for epoch := uint64(1); epoch <= 200; epoch++ {
		if _, _, err := b.Get(key); err != nil { // opens the shared transaction
			t.Fatal(err)
		}
		muts := []Mutation{{Key: key, Value: binary.BigEndian.AppendUint64(nil, epoch)}}
		// 64 KiB values under new keys make the file grow, so bbolt
		// remaps it during some of these Applies.
		muts = append(muts, Mutation{Key: binary.BigEndian.AppendUint64([]byte("fill"), epoch), Value: filler})
		if err := b.Apply(muts, Meta{Epoch: epoch}); err != nil {
			t.Fatal(err)
		}
		v, ok, err := b.Get(key)
		if err != nil || !ok || binary.BigEndian.Uint64(v) != epoch {
			t.Fatalf("epoch %d: Get = %v, %v, %v after its Apply", epoch, v, ok, err)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Batches past the last key are applied as appends into packed pages
// (FillPercent 1); later inserts between those keys, longer values and
// deletes split and merge the full pages. The state must read back exactly,
// the stats must match it, and bbolt's own check must pass after a reopen.
func TestBoltPackedAppendsStayConsistent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.db")
	b, err := openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	apply := func(muts []Mutation) {
		t.Helper()
		for _, m := range muts { // before Apply, which sorts muts in place
			if m.Value == nil {
				delete(want, string(m.Key))
			} else {
				want[string(m.Key)] = string(m.Value)
			}
		}
		if err := b.Apply(muts, Meta{}); err != nil {
			t.Fatal(err)
		}
	}
	// bbolt's own check, every finding drained (its goroutine reads on
	// until the channel is empty).
	check := func(b *boltBackend) error {
		return b.db.View(func(tx *bolt.Tx) error {
			var errs []error
			for err := range tx.Check() {
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		})
	}
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%08d", i) }
	for start := 0; start < 25000; start += 5000 { // appends
		var muts []Mutation
		for i := start; i < start+5000; i++ {
			muts = append(muts, Mutation{Key: key(2 * i), Value: []byte("v")})
		}
		apply(muts)
	}
	if err := b.db.View(func(tx *bolt.Tx) error {
		st := tx.Bucket(stateBucket).Stats()
		if fill := float64(st.LeafInuse) / float64(st.LeafAlloc); fill < 0.9 {
			return fmt.Errorf("leaf pages %.0f%% full after appends, want them packed", 100*fill)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := check(b); err != nil {
		t.Fatalf("bbolt's check after the appends: %v", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3 { // inserts between the packed keys, growth, deletes
		var muts []Mutation
		for range 3000 {
			i := rng.IntN(50000)
			switch rng.IntN(3) {
			case 0:
				muts = append(muts, Mutation{Key: key(i), Value: bytes.Repeat([]byte("x"), 1+rng.IntN(200))})
			case 1:
				muts = append(muts, Mutation{Key: key(i)})
			default:
				muts = append(muts, Mutation{Key: key(i), Value: []byte("w")})
			}
		}
		apply(muts)
	}
	verify := func(b *boltBackend) {
		t.Helper()
		var keys, byt int64
		for k, v := range want {
			got, ok, err := b.Get([]byte(k))
			if err != nil || !ok || string(got) != v {
				t.Fatalf("Get(%s) = %q, %v, %v; want %q", k, got, ok, err, v)
			}
			keys++
			byt += int64(len(k) + len(v))
		}
		if st := b.Stats(); st.Keys != keys || st.Bytes != byt {
			t.Fatalf("Stats = %+v, want %d keys and %d bytes", st, keys, byt)
		}
	}
	verify(b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b, err = openBolt(path, DefaultLockTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	verify(b)
	if err := check(b); err != nil {
		t.Fatalf("bbolt's check: %v", err)
	}
}
