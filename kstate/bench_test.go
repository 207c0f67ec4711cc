package kstate_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// BenchmarkApply measures one epoch's apply: 10k sorted mutations in one
// backend transaction, over a 100k keyspace so that most ops after warm-up
// overwrite existing keys, as steady-state epochs do.
func BenchmarkApply(b *testing.B) {
	const batch, keyspace = 10_000, 100_000
	var batches [][]kstate.Mutation
	for start := 0; start < keyspace; start += batch {
		muts := make([]kstate.Mutation, batch)
		for i := range muts {
			k := kstate.EncodeKey(kstate.KindKeyed, "count", fmt.Appendf(nil, "user-%08d", start+i), nil)
			muts[i] = kstate.Mutation{Key: k, Value: make([]byte, 64)}
		}
		batches = append(batches, muts)
	}
	for _, kind := range backends {
		b.Run(kind, func(b *testing.B) {
			be := kstatetest.MustOpen(b, kind)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if err := be.Apply(batches[n%len(batches)], kstate.Meta{Epoch: uint64(n)}); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(batch*n)/b.Elapsed().Seconds(), "muts/s")
		})
	}
}

// BenchmarkStoreGet measures the per-record read path for a key found in
// the epoch write-set and for one found only in the backend.
func BenchmarkStoreGet(b *testing.B) {
	key := kstate.EncodeKey(kstate.KindKeyed, "count", []byte("user-1"), nil)
	for _, kind := range backends {
		for _, where := range []string{"write-set", "backend"} {
			b.Run(kind+"/"+where, func(b *testing.B) {
				st := kstate.NewStore(kstatetest.MustOpen(b, kind))
				st.Put(key, make([]byte, 8))
				st.CommitRecord()
				if where == "backend" {
					if err := st.Apply(st.Dirty(), kstate.Meta{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					if _, ok, err := st.Get(key); !ok || err != nil {
						b.Fatal(ok, err)
					}
				}
			})
		}
	}
}

// BenchmarkValueIncrement is the aggregate job's state work per record:
// read a counter, write it back, commit the record; an epoch every 1000
// records over 10k keys.
func BenchmarkValueIncrement(b *testing.B) {
	count := kstate.Value("count", kstate.Int64())
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	for _, kind := range backends {
		b.Run(kind, func(b *testing.B) {
			st := kstate.NewStore(kstatetest.MustOpen(b, kind))
			sc := kstatetest.NewScope(st)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				sc.SetKey(keys[n%len(keys)])
				v, _, err := count.Get(sc)
				if err == nil {
					err = count.Set(sc, v+1)
				}
				if err != nil {
					b.Fatal(err)
				}
				st.CommitRecord()
				if n++; n%1000 == 0 {
					if err := st.Apply(st.Dirty(), kstate.Meta{Epoch: uint64(n)}); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkSweepExpired measures one sweep call of 1000 entries over state
// of two sizes, all of it live so every call examines its full limit. The
// time per call should not grow with the state: that is what ScanFrom's
// seek buys over a scan from the beginning.
func BenchmarkSweepExpired(b *testing.B) {
	const limit = 1000
	v := kstate.Value("session", kstate.Int64(), kstate.WithTTL(time.Hour, kstate.OnCreateAndWrite))
	for _, kind := range backends {
		for _, size := range []int{10_000, 100_000} {
			b.Run(fmt.Sprintf("%s/%dk", kind, size/1000), func(b *testing.B) {
				st := kstate.NewStore(kstatetest.MustOpen(b, kind))
				sc := kstatetest.NewScope(st)
				for i := range size {
					if err := v.Set(sc.SetKey(fmt.Sprintf("user-%08d", i)), int64(i)); err != nil {
						b.Fatal(err)
					}
				}
				st.CommitRecord()
				if err := st.Apply(st.Dirty(), kstate.Meta{Epoch: 1}); err != nil {
					b.Fatal(err)
				}
				var cursor []byte
				b.ReportAllocs()
				for b.Loop() {
					next, removed, err := kstate.SweepExpired(st, kstatetest.Epoch, cursor, limit)
					if err != nil || removed != 0 {
						b.Fatal(removed, err)
					}
					cursor = next
				}
				b.ReportMetric(float64(limit*b.N)/b.Elapsed().Seconds(), "entries/s")
			})
		}
	}
}

// agg32 is a 32-byte fixed-width value, like the aggregate job's.
type agg32 struct{ a, b, c, d int64 }

type agg32Codec struct{}

func (c agg32Codec) Encode(v agg32) ([]byte, error) { return c.AppendEncode(nil, v) }
func (agg32Codec) AppendEncode(b []byte, v agg32) ([]byte, error) {
	for _, x := range [4]int64{v.a, v.b, v.c, v.d} {
		b = binary.BigEndian.AppendUint64(b, uint64(x))
	}
	return b, nil
}
func (agg32Codec) Decode(b []byte) (agg32, error) {
	if len(b) != 32 {
		return agg32{}, fmt.Errorf("%d bytes", len(b))
	}
	x := func(i int) int64 { return int64(binary.BigEndian.Uint64(b[8*i:])) }
	return agg32{x(0), x(1), x(2), x(3)}, nil
}

// The epoch benchmarks write state as make bench's aggregate does:
// epochKeys keys in turn over epochTasks tasks' stores, an epoch every
// epochRecords records (100 ms at 1.2M records/s).
const epochTasks, epochKeys, epochRecords = 4, 10_000, 120_000

// epochKeyNames are the keys, k0 to k9999, made once so that no case
// pays a key's conversion per record.
var epochKeyNames = func() [][]byte {
	names := make([][]byte, epochKeys)
	for i := range names {
		names[i] = fmt.Appendf(nil, "k%d", i)
	}
	return names
}()

// epochScope is a task's Scope in runEpochs: its store and the record's
// key, set without a copy (kstatetest.Scope.SetKey converts a string,
// an allocation per record the engine does not make).
type epochScope struct {
	store *kstate.Store
	key   []byte
}

func (s *epochScope) Store() *kstate.Store { return s.store }
func (s *epochScope) Key() []byte          { return s.key }
func (s *epochScope) Now() time.Time       { return kstatetest.Epoch }

// runEpochs calls write for each record, its key set on the scope of its
// task's Store over a backend of kind, then commits the record; each
// epoch is applied outside the timing.
func runEpochs(b *testing.B, kind string, write func(sc kstate.Scope, n int) error) {
	var scopes [epochTasks]*epochScope
	for i := range scopes {
		scopes[i] = &epochScope{store: kstate.NewStore(kstatetest.MustOpen(b, kind))}
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		k := n % epochKeys
		sc := scopes[k%epochTasks]
		sc.key = epochKeyNames[k]
		if err := write(sc, n); err != nil {
			b.Fatal(err)
		}
		sc.store.CommitRecord()
		if n++; n%epochRecords == 0 {
			b.StopTimer()
			for _, sc := range scopes {
				if err := sc.store.Apply(sc.store.Dirty(), kstate.Meta{Epoch: uint64(n)}); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	}
}

// BenchmarkEpochAggregate is the aggregate job's state work (runEpochs):
// a 32-byte value read and written back per record.
func BenchmarkEpochAggregate(b *testing.B) {
	v := kstate.Value[agg32]("aggregate", agg32Codec{})
	// The same work in a Go map per task, as the job by hand keeps it
	// (make bench's raw-aggregate-eos): nothing durable, no epochs.
	b.Run("go-map", func(b *testing.B) {
		var maps [epochTasks]map[string]*agg32
		for i := range maps {
			maps[i] = map[string]*agg32{}
		}
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			k := n % epochKeys
			m := maps[k%epochTasks]
			a := m[string(epochKeyNames[k])]
			if a == nil {
				a = &agg32{}
				m[string(epochKeyNames[k])] = a
			}
			a.a++
			a.b += int64(n)
			n++
		}
	})
	for _, kind := range backends {
		b.Run(kind, func(b *testing.B) {
			runEpochs(b, kind, func(sc kstate.Scope, n int) error {
				a, _, err := v.Get(sc)
				if err != nil {
					return err
				}
				a.a++
				a.b += int64(n)
				return v.Set(sc, a)
			})
		})
	}
}

// BenchmarkEpochBytes is runEpochs with raw values of three sizes (Bytes
// codec, memory backend): what a key written many times in an epoch costs
// in time and in new memory as its value grows.
func BenchmarkEpochBytes(b *testing.B) {
	v := kstate.Value("v", kstate.Bytes())
	for _, size := range []int{32, 256, 2048} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			val := make([]byte, size)
			runEpochs(b, "memory", func(sc kstate.Scope, n int) error {
				val[0] = byte(n)
				return v.Set(sc, val)
			})
		})
	}
}
