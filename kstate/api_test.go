package kstate_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

func TestOpenAndRemove(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	b, err := kstate.Open(kstate.BoltBackend, dir, "in-3")
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, b, kstate.Meta{}, put("a", "1"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "in-3.db")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("bbolt file not at %s: %v", path, err)
	}
	for _, kind := range backends {
		if err := kstate.Remove(kind, dir, "in-3"); err != nil {
			t.Fatalf("Remove(%s) = %v", kind, err)
		}
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file still there after Remove: %v", err)
	}
	if err := kstate.Remove(kstate.BoltBackend, dir, "in-3"); err != nil {
		t.Fatalf("second Remove = %v, want nil", err)
	}

	if _, err := kstate.Open("rocksdb", dir, "t"); !errors.Is(err, kstate.ErrUnknownBackend) {
		t.Fatalf("Open(rocksdb) = %v", err)
	}
	if err := kstate.Remove("rocksdb", dir, "t"); !errors.Is(err, kstate.ErrUnknownBackend) {
		t.Fatalf("Remove(rocksdb) = %v", err)
	}
	for _, task := range []string{"", ".", "..", "a/b", "../x"} {
		if _, err := kstate.Open(kstate.MemoryBackend, dir, task); err == nil {
			t.Errorf("Open with task %q did not fail", task)
		}
		if err := kstate.Remove(kstate.BoltBackend, dir, task); err == nil {
			t.Errorf("Remove with task %q did not fail", task)
		}
	}
}

func TestDeclarationPanics(t *testing.T) {
	sum := func(a, b int64) int64 { return a + b }
	tests := []struct {
		name    string
		declare func()
	}{
		{"value empty name", func() { kstate.Value("", kstate.Int64()) }},
		{"value nil codec", func() { kstate.Value[int64]("v", nil) }},
		{"list empty name", func() { kstate.List("", kstate.Int64()) }},
		{"map nil key codec", func() { kstate.Map[string, int64]("m", nil, kstate.Int64()) }},
		{"map nil value codec", func() { kstate.Map[string, int64]("m", kstate.String(), nil) }},
		{"reducing nil func", func() { kstate.Reducing("r", kstate.Int64(), nil) }},
		{"reducing empty name", func() { kstate.Reducing("", kstate.Int64(), sum) }},
		{"aggregating nil func", func() {
			kstate.Aggregating[int64, avgAcc, float64]("a", kstate.JSON[avgAcc](), nil)
		}},
		{"ttl zero", func() { kstate.WithTTL(0, kstate.OnCreateAndWrite) }},
		{"ttl under a millisecond", func() { kstate.WithTTL(time.Microsecond, kstate.OnCreateAndWrite) }},
		{"ttl bad update", func() { kstate.WithTTL(time.Second, 0) }},
		{"timer bad domain", func() {
			kstate.RegisterTimer(kstatetest.NewScope(kstate.NewStore(kstate.NewMemory())), 3, time.Now())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			tt.declare()
		})
	}
}

func TestCodecs(t *testing.T) {
	type rec struct {
		A string
		B []int
	}
	roundTrip := func(t *testing.T, enc func() ([]byte, error), dec func([]byte) error, want []byte) {
		t.Helper()
		b, err := enc()
		if err != nil {
			t.Fatal(err)
		}
		if want != nil && !bytes.Equal(b, want) {
			t.Fatalf("encoding %x, want %x", b, want)
		}
		if err := dec(b); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("int64", func(t *testing.T) {
		for _, v := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64} {
			var got int64
			roundTrip(t, func() ([]byte, error) { return kstate.Int64().Encode(v) },
				func(b []byte) (err error) { got, err = kstate.Int64().Decode(b); return }, nil)
			if got != v {
				t.Fatalf("got %d, want %d", got, v)
			}
		}
		b, _ := kstate.Int64().Encode(258)
		if !bytes.Equal(b, []byte{0, 0, 0, 0, 0, 0, 1, 2}) {
			t.Fatalf("Int64 encoding %x is not 8-byte big-endian", b)
		}
		if _, err := kstate.Int64().Decode([]byte{1}); err == nil {
			t.Fatal("short int64 decoded")
		}
	})
	t.Run("float64", func(t *testing.T) {
		for _, v := range []float64{0, -2.5, math.Inf(1), math.SmallestNonzeroFloat64} {
			var got float64
			roundTrip(t, func() ([]byte, error) { return kstate.Float64().Encode(v) },
				func(b []byte) (err error) { got, err = kstate.Float64().Decode(b); return }, nil)
			if got != v {
				t.Fatalf("got %g, want %g", got, v)
			}
		}
		b, _ := kstate.Float64().Encode(1)
		if !bytes.Equal(b, []byte{0x3f, 0xf0, 0, 0, 0, 0, 0, 0}) {
			t.Fatalf("Float64 encoding %x", b)
		}
		if _, err := kstate.Float64().Decode(nil); err == nil {
			t.Fatal("empty float64 decoded")
		}
	})
	t.Run("string", func(t *testing.T) {
		var got string
		roundTrip(t, func() ([]byte, error) { return kstate.String().Encode("héllo") },
			func(b []byte) (err error) { got, err = kstate.String().Decode(b); return }, []byte("héllo"))
		if got != "héllo" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("bytes decode copies", func(t *testing.T) {
		stored := []byte("abc")
		got, _ := kstate.Bytes().Decode(stored)
		got[0] = 'X'
		if string(stored) != "abc" {
			t.Fatal("Bytes().Decode aliases its input")
		}
		if b, _ := kstate.Bytes().Encode(stored); !bytes.Equal(b, stored) {
			t.Fatal("Bytes().Encode is not the identity")
		}
	})
	t.Run("json", func(t *testing.T) {
		var got rec
		c := kstate.JSON[rec]()
		roundTrip(t, func() ([]byte, error) { return c.Encode(rec{"x", []int{1, 2}}) },
			func(b []byte) (err error) { got, err = c.Decode(b); return }, []byte(`{"A":"x","B":[1,2]}`))
		if got.A != "x" || len(got.B) != 2 {
			t.Fatalf("got %+v", got)
		}
		if _, err := c.Decode([]byte("{")); err == nil {
			t.Fatal("bad json decoded")
		}
	})
}

// A record key too long for any backend must fail the record at the write,
// before the epoch is committed to Kafka, never at Apply after it.
func TestUnstorableRecordKey(t *testing.T) {
	sc := kstatetest.NewScope(kstate.NewStore(kstate.NewMemory()))
	sc.SetKey(strings.Repeat("k", kstate.MaxKeySize))
	count := kstate.Value("count", kstate.Int64())
	if err := count.Set(sc, 1); !errors.Is(err, kstate.ErrBadKey) || !strings.Contains(err.Error(), `"count"`) {
		t.Fatalf("Set = %v, want ErrBadKey naming the state", err)
	}
	if !errors.Is(sc.Store().RecordErr(), kstate.ErrBadKey) {
		t.Fatal("RecordErr not set by a refused state write")
	}
	sc.Store().RollbackRecord()
	kstate.RegisterTimer(sc, kstate.EventTime, time.Now())
	if !errors.Is(sc.Store().RecordErr(), kstate.ErrBadKey) {
		t.Fatal("RecordErr not set by a refused timer")
	}
}

func TestStringers(t *testing.T) {
	for v, want := range map[interface{ String() string }]string{
		kstate.KindKeyed: "keyed", kstate.KindTimer: "timer", kstate.KindOperator: "operator",
		kstate.KindMarker: "marker", kstate.KindKeyedTTL: "keyed-ttl", kstate.Kind(9): "Kind(9)",
		kstate.EventTime: "event-time", kstate.ProcessingTime: "processing-time", kstate.TimeDomain(0): "TimeDomain(0)",
	} {
		if got := v.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
}

// Timers before 1970 cannot be ordered by the unsigned encoding; they are
// kept, at 1970, rather than lost or misordered.
func TestTimerBeforeUnixEpoch(t *testing.T) {
	st := kstate.NewStore(kstate.NewMemory())
	sc := kstatetest.NewScope(st).SetKey("k")
	kstate.RegisterTimer(sc, kstate.ProcessingTime, time.UnixMilli(-5000))
	kstate.RegisterTimer(sc, kstate.ProcessingTime, time.UnixMilli(1))
	due, err := kstate.DueTimers(st, kstate.ProcessingTime, time.UnixMilli(0), 0)
	if err != nil || len(due) != 1 || due[0].At.UnixMilli() != 0 {
		t.Fatalf("DueTimers = %+v, %v; want the clamped timer at 0", due, err)
	}
	kstate.DeleteTimer(sc, kstate.ProcessingTime, time.UnixMilli(-1))
	if due, _ := kstate.DueTimers(st, kstate.ProcessingTime, time.UnixMilli(0), 0); len(due) != 0 {
		t.Fatalf("DeleteTimer of a pre-1970 time left %+v", due)
	}
}
