package kstate_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

var stateCases = []conformanceCase{
	{"State/Value", testValueState},
	{"State/List", testListState},
	{"State/Map", testMapState},
	{"State/MapPrefixIsolation", testMapPrefixIsolation},
	{"State/Reducing", testReducingState},
	{"State/Aggregating", testAggregatingState},
	{"State/CodecErrorsNameTheState", testCodecErrors},
	{"State/RollbackLeavesNoTrace", testStateRollback},
	{"State/TTL", testTTL},
	{"State/ReadStore", testReadStore},
	{"State/ReadStoreScanBesideApply", testReadStoreScanBesideApply},
	{"State/ValueAll", testValueAll},
	{"State/Keys", testKeys},
	{"State/ReadStoreScanInChunks", testReadStoreScanInChunks},
}

// newScope returns a scope over a fresh store of kind, keyed "k1".
func newScope(t *testing.T, kind string) *kstatetest.Scope {
	t.Helper()
	return kstatetest.NewScope(storeOver(t, kind)).SetKey("k1")
}

// endEpoch commits the record and applies the epoch, so that later reads
// come from the backend rather than the write-sets.
func endEpoch(t *testing.T, sc *kstatetest.Scope) {
	t.Helper()
	st := sc.Store()
	if err := st.RecordErr(); err != nil {
		t.Fatalf("RecordErr: %v", err)
	}
	st.CommitRecord()
	m, err := st.Backend().Meta()
	if err != nil {
		t.Fatal(err)
	}
	m.Epoch++
	if err := st.Apply(st.Dirty(), m); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantValue[T comparable](t *testing.T, get func(kstate.Scope) (T, bool, error), sc kstate.Scope, want T, wantOK bool) {
	t.Helper()
	got, ok, err := get(sc)
	if err != nil || ok != wantOK || got != want {
		t.Fatalf("key %q: Get = %v, %v, %v; want %v, %v", sc.Key(), got, ok, err, want, wantOK)
	}
}

func testValueState(t *testing.T, kind string) {
	count := kstate.Value("count", kstate.Int64())
	other := kstate.Value("count2", kstate.Int64())
	sc := newScope(t, kind)
	wantValue(t, count.Get, sc, 0, false)
	must(t, count.Set(sc, 5))
	wantValue(t, count.Get, sc, 5, true)
	wantValue(t, other.Get, sc, 0, false)
	sc.SetKey("k2")
	wantValue(t, count.Get, sc, 0, false)
	must(t, count.Set(sc, -7))
	endEpoch(t, sc)
	wantValue(t, count.Get, sc, -7, true)
	must(t, count.Clear(sc))
	wantValue(t, count.Get, sc, 0, false)
	sc.SetKey("k1")
	wantValue(t, count.Get, sc, 5, true)
	if count.Name() != "count" {
		t.Fatalf("Name = %q", count.Name())
	}

	// The empty record key is a key like any other.
	sc.SetKey("")
	must(t, count.Set(sc, 1))
	endEpoch(t, sc)
	wantValue(t, count.Get, sc, 1, true)
}

func testListState(t *testing.T, kind string) {
	list := kstate.List("events", kstate.String())
	sc := newScope(t, kind)
	wantList := func(want ...string) {
		t.Helper()
		got, err := list.Get(sc)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("List.Get = %q, %v; want %q", got, err, want)
		}
	}
	wantList()
	must(t, list.Add(sc, "a"))
	must(t, list.Add(sc, ""))
	wantList("a", "")
	endEpoch(t, sc)
	must(t, list.Add(sc, strings.Repeat("x", 300)))
	wantList("a", "", strings.Repeat("x", 300))
	must(t, list.Update(sc, []string{"u", "v"}))
	wantList("u", "v")
	sc.SetKey("k2")
	wantList()
	sc.SetKey("k1")
	endEpoch(t, sc)
	wantList("u", "v")
	must(t, list.Update(sc, nil)) // an empty update clears
	wantList()
	if _, ok, _ := sc.Store().Get(kstate.EncodeKey(kstate.KindKeyed, "events", []byte("k1"), nil)); ok {
		t.Fatal("empty list left an entry behind")
	}
	must(t, list.Add(sc, "z"))
	must(t, list.Clear(sc))
	wantList()
}

func testMapState(t *testing.T, kind string) {
	m := kstate.Map("prices", kstate.String(), kstate.Float64())
	sc := newScope(t, kind)
	wantEntries := func(want ...string) {
		t.Helper()
		var got []string
		must(t, m.Entries(sc, func(k string, v float64) error {
			got = append(got, fmt.Sprintf("%s=%g", k, v))
			return nil
		}))
		if !slices.Equal(got, want) {
			t.Fatalf("Entries = %q, want %q", got, want)
		}
	}
	wantEntries()
	must(t, m.Put(sc, "x", 1.5))
	must(t, m.Put(sc, "a", 2))
	endEpoch(t, sc)
	must(t, m.Put(sc, "m", 3))
	must(t, m.Put(sc, "", -1)) // the empty map key sorts first
	wantEntries("=-1", "a=2", "m=3", "x=1.5")
	wantValue(t, func(s kstate.Scope) (float64, bool, error) { return m.Get(s, "x") }, sc, 1.5, true)
	wantValue(t, func(s kstate.Scope) (float64, bool, error) { return m.Get(s, "nope") }, sc, 0, false)
	must(t, m.Remove(sc, "m"))
	must(t, m.Remove(sc, "a"))
	wantEntries("=-1", "x=1.5")
	endEpoch(t, sc)
	wantEntries("=-1", "x=1.5")

	// fn may read the map it iterates (a nested read of the backend).
	must(t, m.Entries(sc, func(k string, v float64) error {
		got, ok, err := m.Get(sc, k)
		if err != nil || !ok || got != v {
			return fmt.Errorf("Get(%q) inside Entries = %v, %v, %v; want %v", k, got, ok, err, v)
		}
		return nil
	}))

	// fn's error comes back as it is, and stops the iteration.
	boom := errors.New("boom")
	calls := 0
	err := m.Entries(sc, func(string, float64) error { calls++; return boom })
	if err != boom || calls != 1 {
		t.Fatalf("Entries = %v after %d calls, want boom after 1", err, calls)
	}
	sc.SetKey("k2")
	wantEntries()
	sc.SetKey("k1")
	must(t, m.Clear(sc))
	wantEntries()
	endEpoch(t, sc)
	wantEntries()
	if s := sc.Store().Backend().Stats(); s.Keys != 0 {
		t.Fatalf("backend keys after Clear = %d, want 0", s.Keys)
	}
}

// A map's prefix for one record key must not cover another record key's map
// or another state, whatever their bytes.
func testMapPrefixIsolation(t *testing.T, kind string) {
	m := kstate.Map("m", kstate.String(), kstate.Int64())
	mm := kstate.Map("mm", kstate.String(), kstate.Int64())
	sc := newScope(t, kind)
	for _, k := range []string{"k", "k1", "k12", ""} {
		sc.SetKey(k)
		must(t, m.Put(sc, "e", int64(len(k))))
		must(t, mm.Put(sc, "e", 100))
	}
	endEpoch(t, sc)
	sc.SetKey("k1")
	must(t, m.Clear(sc))
	for _, k := range []string{"k", "k12", ""} {
		sc.SetKey(k)
		n := 0
		must(t, m.Entries(sc, func(key string, v int64) error {
			if n++; v != int64(len(k)) {
				t.Errorf("key %q sees %s=%d", k, key, v)
			}
			return nil
		}))
		if n != 1 {
			t.Errorf("key %q: %d entries, want 1", k, n)
		}
	}
}

func testReducingState(t *testing.T, kind string) {
	sum := kstate.Reducing("sum", kstate.Int64(), func(a, b int64) int64 { return a + b })
	sc := newScope(t, kind)
	wantValue(t, sum.Get, sc, 0, false)
	for _, v := range []int64{1, 2, 3} {
		must(t, sum.Add(sc, v))
	}
	wantValue(t, sum.Get, sc, 6, true)
	endEpoch(t, sc)
	must(t, sum.Add(sc, 10))
	wantValue(t, sum.Get, sc, 16, true)
	must(t, sum.Clear(sc))
	wantValue(t, sum.Get, sc, 0, false)
}

type avgAcc struct{ Count, Sum int64 }

type average struct{}

func (average) CreateAccumulator() avgAcc { return avgAcc{} }
func (average) Add(in int64, acc avgAcc) avgAcc {
	return avgAcc{Count: acc.Count + 1, Sum: acc.Sum + in}
}
func (average) Result(acc avgAcc) float64 { return float64(acc.Sum) / float64(acc.Count) }

func testAggregatingState(t *testing.T, kind string) {
	avg := kstate.Aggregating("avg", kstate.JSON[avgAcc](), average{})
	sc := newScope(t, kind)
	wantValue(t, avg.Get, sc, 0, false)
	must(t, avg.Add(sc, 1))
	must(t, avg.Add(sc, 2))
	endEpoch(t, sc)
	must(t, avg.Add(sc, 6))
	wantValue(t, avg.Get, sc, 3, true)
	must(t, avg.Clear(sc))
	wantValue(t, avg.Get, sc, 0, false)
}

var errCodec = errors.New("codec failure")

type failingCodec struct{}

func (failingCodec) Encode(int64) ([]byte, error) { return nil, errCodec }
func (failingCodec) Decode([]byte) (int64, error) { return 0, errCodec }

func testCodecErrors(t *testing.T, kind string) {
	sc := newScope(t, kind)
	bad := kstate.Value("badcodec", failingCodec{})
	// Stored bytes the Int64 codec cannot read (wrong width).
	sc.Store().Put(kstate.EncodeKey(kstate.KindKeyed, "short", []byte("k1"), nil), []byte{1, 2, 3})
	short := kstate.Value("short", kstate.Int64())
	shortList := kstate.List("shortlist", kstate.Int64())
	sc.Store().Put(kstate.EncodeKey(kstate.KindKeyed, "shortlist", []byte("k1"), nil), []byte{5, 1})
	tests := []struct {
		name  string
		state string
		op    func() error
		is    error
	}{
		{"encode", "badcodec", func() error { return bad.Set(sc, 1) }, errCodec},
		{"decode", "short", func() error { _, _, err := short.Get(sc); return err }, nil},
		{"list framing", "shortlist", func() error { _, err := shortList.Get(sc); return err }, kstate.ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op()
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.state)) {
				t.Fatalf("error %v does not name state %q", err, tt.state)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
}

// A failed record (sent to the DLQ) must leave state exactly as it was.
func testStateRollback(t *testing.T, kind string) {
	count := kstate.Value("count", kstate.Int64())
	m := kstate.Map("m", kstate.String(), kstate.Int64())
	sc := newScope(t, kind)
	must(t, count.Set(sc, 1))
	must(t, m.Put(sc, "a", 1))
	sc.Store().CommitRecord()
	before := sc.Store().Dirty()

	must(t, count.Set(sc, 2))
	must(t, m.Put(sc, "b", 2))
	must(t, m.Clear(sc))
	kstate.RegisterTimer(sc, kstate.EventTime, kstatetest.Epoch)
	sc.Store().RollbackRecord()

	wantValue(t, count.Get, sc, 1, true)
	if after := sc.Store().Dirty(); len(after) != len(before) {
		t.Fatalf("Dirty has %d keys after rollback, want %d", len(after), len(before))
	}
}

func testTTL(t *testing.T, kind string) {
	const ttl = 10 * time.Second
	type step struct {
		advance time.Duration
		op      string // "set", "get", "flush"
		want    bool   // for get: present?
	}
	tests := []struct {
		name   string
		update kstate.TTLUpdate
		steps  []step
	}{
		{"create-and-write expires", kstate.OnCreateAndWrite, []step{
			{0, "set", false}, {ttl - time.Millisecond, "get", true}, {time.Millisecond, "get", false},
		}},
		{"create-and-write read does not extend", kstate.OnCreateAndWrite, []step{
			{0, "set", false}, {6 * time.Second, "get", true}, {6 * time.Second, "get", false},
		}},
		{"create-and-write write extends", kstate.OnCreateAndWrite, []step{
			{0, "set", false}, {6 * time.Second, "set", false}, {6 * time.Second, "get", true},
		}},
		{"read-and-write read extends", kstate.OnReadAndWrite, []step{
			{0, "set", false}, {6 * time.Second, "get", true}, {6 * time.Second, "get", true},
			{ttl, "get", false},
		}},
		{"survives the backend", kstate.OnCreateAndWrite, []step{
			{0, "set", false}, {0, "flush", false}, {time.Second, "get", true},
			{0, "flush", false}, {ttl, "get", false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := kstate.Value("v", kstate.Int64(), kstate.WithTTL(ttl, tt.update))
			sc := newScope(t, kind)
			for i, s := range tt.steps {
				sc.Advance(s.advance)
				switch s.op {
				case "set":
					must(t, v.Set(sc, int64(i)))
				case "flush":
					endEpoch(t, sc)
				case "get":
					_, ok, err := v.Get(sc)
					if err != nil || ok != s.want {
						t.Fatalf("step %d: Get = %v, %v; want present=%v", i, ok, err, s.want)
					}
				}
			}
			// An expired value was deleted lazily: the delete is dirty.
			sc.Store().CommitRecord()
			last := tt.steps[len(tt.steps)-1]
			if !last.want {
				d := sc.Store().Dirty()
				if len(d) != 1 || d[0].Value != nil {
					t.Fatalf("after expiry Dirty = %v, want one tombstone", d)
				}
			}
		})
	}

	t.Run("map entries expire one by one", func(t *testing.T) {
		m := kstate.Map("m", kstate.String(), kstate.Int64(), kstate.WithTTL(ttl, kstate.OnCreateAndWrite))
		sc := newScope(t, kind)
		entries := func() (out []string) {
			must(t, m.Entries(sc, func(k string, _ int64) error { out = append(out, k); return nil }))
			return out
		}
		must(t, m.Put(sc, "x", 1))
		sc.Advance(5 * time.Second)
		must(t, m.Put(sc, "y", 2))
		endEpoch(t, sc)
		sc.Advance(5 * time.Second)
		if got := entries(); !slices.Equal(got, []string{"y"}) {
			t.Fatalf("Entries = %q, want [y]", got)
		}
		if _, ok, _ := m.Get(sc, "x"); ok {
			t.Fatal("expired entry x returned")
		}
		sc.Advance(5 * time.Second)
		if got := entries(); len(got) != 0 {
			t.Fatalf("Entries = %q, want none", got)
		}
		endEpoch(t, sc)
		if s := sc.Store().Backend().Stats(); s.Keys != 0 {
			t.Fatalf("expired entries still stored: %d keys", s.Keys)
		}
	})

	t.Run("list expires as a whole", func(t *testing.T) {
		l := kstate.List("l", kstate.String(), kstate.WithTTL(ttl, kstate.OnCreateAndWrite))
		sc := newScope(t, kind)
		must(t, l.Add(sc, "a"))
		sc.Advance(5 * time.Second)
		must(t, l.Add(sc, "b"))
		sc.Advance(9 * time.Second)
		if got, err := l.Get(sc); err != nil || !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("Get = %q, %v", got, err)
		}
		sc.Advance(time.Second)
		if got, err := l.Get(sc); err != nil || got != nil {
			t.Fatalf("Get after expiry = %q, %v", got, err)
		}
	})
}

// testReadStore reads a task's state through NewReadStore, as a query
// does: every state type reads what the backend holds and nothing of the
// task's open epoch; a write fails the store and changes nothing; an
// expired value reads as absent without being deleted, and a read does not
// push an expiry forward.
func testReadStore(t *testing.T, kind string) {
	const ttl = 10 * time.Second
	count := kstate.Value("count", kstate.Int64())
	names := kstate.List("names", kstate.String())
	attrs := kstate.Map("attrs", kstate.String(), kstate.Int64())
	sum := kstate.Reducing("sum", kstate.Int64(), func(a, b int64) int64 { return a + b })
	short := kstate.Value("short", kstate.Int64(), kstate.WithTTL(ttl, kstate.OnCreateAndWrite))
	touched := kstate.Value("touched", kstate.Int64(), kstate.WithTTL(ttl, kstate.OnReadAndWrite))

	job := newScope(t, kind)
	must(t, count.Set(job, 3))
	must(t, names.Add(job, "a"))
	must(t, names.Add(job, "b"))
	must(t, attrs.Put(job, "x", 1))
	must(t, attrs.Put(job, "y", 2))
	must(t, sum.Add(job, 4))
	must(t, short.Set(job, 5))
	must(t, touched.Set(job, 6))
	endEpoch(t, job)
	// The open epoch: the task's writes since its last commit.
	must(t, count.Set(job, 4))
	must(t, attrs.Put(job, "z", 3))
	must(t, sum.Add(job, 100))
	job.Store().CommitRecord()

	q := kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend())).SetKey("k1")
	wantValue(t, count.Get, q, 3, true)
	wantValue(t, sum.Get, q, 4, true)
	if got, err := names.Get(q); err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("list = %q, %v; want [a b]", got, err)
	}
	var entries []string
	must(t, attrs.Entries(q, func(k string, v int64) error {
		entries = append(entries, fmt.Sprintf("%s=%d", k, v))
		return nil
	}))
	if !slices.Equal(entries, []string{"x=1", "y=2"}) {
		t.Fatalf("map entries = %q; want [x=1 y=2]", entries)
	}
	wantValue(t, count.Get, q.SetKey("k2"), 0, false)
	q.SetKey("k1")

	// A read does not extend the expiry: at 6 s and again at 12 s the
	// OnReadAndWrite value has expired for the query as for the job.
	q.Advance(6 * time.Second)
	wantValue(t, touched.Get, q, 6, true)
	if n := q.Store().DirtyLen(); n != 0 {
		t.Fatalf("a read through the read store dirtied %d keys", n)
	}
	q.Advance(6 * time.Second)
	wantValue(t, short.Get, q, 0, false)
	wantValue(t, touched.Get, q, 0, false)
	if n := q.Store().DirtyLen(); n != 0 {
		t.Fatalf("an expired read through the read store dirtied %d keys", n)
	}
	if err := q.Store().RecordErr(); err != nil {
		t.Fatalf("reads failed the read store: %v", err)
	}
	// Still in the backend, for the job's own read or sweep to delete.
	job.Advance(12 * time.Second)
	before := job.Store().DirtyLen()
	wantValue(t, short.Get, job, 0, false)
	job.Store().CommitRecord()
	if n := job.Store().DirtyLen(); n != before+1 {
		t.Fatalf("the job's read of the expired value dirtied %d keys, want 1 (its delete): the query's read had deleted it", n-before)
	}

	// Writes of every kind fail the store and change nothing.
	writes := map[string]func() error{
		"Set":      func() error { return count.Set(q, 9) },
		"Clear":    func() error { return count.Clear(q) },
		"List.Add": func() error { return names.Add(q, "c") },
		"Map.Put":  func() error { return attrs.Put(q, "w", 9) },
		"Reduce":   func() error { return sum.Add(q, 1) },
		"Timer": func() error {
			kstate.RegisterTimer(q, kstate.EventTime, time.UnixMilli(1))
			return nil
		},
	}
	for name, write := range writes {
		ro := kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend())).SetKey("k1")
		q = ro
		if err := write(); err != nil && !errors.Is(err, kstate.ErrReadOnly) {
			t.Fatalf("%s through the read store: %v", name, err)
		}
		if err := ro.Store().RecordErr(); !errors.Is(err, kstate.ErrReadOnly) {
			t.Fatalf("%s through the read store: RecordErr = %v, want ErrReadOnly", name, err)
		}
		if n := ro.Store().DirtyLen(); n != 0 {
			t.Fatalf("%s through the read store dirtied %d keys", name, n)
		}
	}
	// Nor can the store's own Apply, or its backend's.
	ro := kstate.NewReadStore(job.Store().Backend())
	if err := ro.Apply(nil, kstate.Meta{Epoch: 99}); !errors.Is(err, kstate.ErrReadOnly) {
		t.Fatalf("Apply through the read store = %v, want ErrReadOnly", err)
	}
	if err := ro.Backend().Apply([]kstate.Mutation{{Key: []byte("x"), Value: []byte("y")}}, kstate.Meta{}); !errors.Is(err, kstate.ErrReadOnly) {
		t.Fatalf("Backend().Apply through the read store = %v, want ErrReadOnly", err)
	}
	if err := ro.Backend().Close(); !errors.Is(err, kstate.ErrReadOnly) {
		t.Fatalf("Backend().Close through the read store = %v, want ErrReadOnly", err)
	}
	if m, err := job.Store().Backend().Meta(); err != nil || m.Epoch != 1 {
		t.Fatalf("the task's meta after the refusals: %+v, %v; want epoch 1", m, err)
	}
	wantValue(t, count.Get, kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend())).SetKey("k1"), 3, true)
}

// testReadStoreScanBesideApply scans a map through a read store, reading
// other state inside the scan's callback, while the task applies epochs:
// a query's scan runs beside Apply, and a callback run inside the
// backend's scan would wait for an Apply waiting for that scan (the memory
// backend's lock; bbolt's remap). The read store copies the range first.
func testReadStoreScanBesideApply(t *testing.T, kind string) {
	attrs := kstate.Map("attrs", kstate.String(), kstate.Int64())
	count := kstate.Value("count", kstate.Int64())
	job := newScope(t, kind)
	for i := range 50 {
		must(t, attrs.Put(job, fmt.Sprint("a", i), int64(i)))
	}
	must(t, count.Set(job, 1))
	endEpoch(t, job)

	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() { // the task: an epoch after another, each a new key
		be := job.Store().Backend()
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			m, err := be.Meta()
			if err == nil {
				m.Epoch++
				err = be.Apply([]kstate.Mutation{{Key: kstate.EncodeKey(kstate.KindKeyed, "filler", fmt.Appendf(nil, "f%d", i), nil), Value: make([]byte, 512)}}, m)
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	defer func() { // the task stops before the store's cleanup closes it
		close(stop)
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// A bound on a deadlock, not a wait for an event: a panic on another
	// goroutine ends the test binary at once with every goroutine's stack
	// (t.Fatal, or a panic here, would run the cleanup, which waits on the
	// deadlock).
	watchdog := time.AfterFunc(2*time.Minute, func() {
		panic("the scans did not end within 2 minutes: a scan's callback and an Apply wait for each other")
	})
	defer watchdog.Stop()
	for range 300 {
		q := kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend())).SetKey("k1")
		n := 0
		err := attrs.Entries(q, func(string, int64) error {
			n++
			_, _, err := count.Get(q)
			return err
		})
		if err == nil && n != 50 {
			err = fmt.Errorf("%d entries, want 50", n)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// testReadStoreScanInChunks scans more entries through a read store than
// one chunk of its copy holds: every entry once, in order, and a stop in
// the second chunk stops.
func testReadStoreScanInChunks(t *testing.T, kind string) {
	attrs := kstate.Map("attrs", kstate.Int64(), kstate.Int64())
	job := newScope(t, kind)
	const n = 2500
	for i := range int64(n) {
		must(t, attrs.Put(job, i, -i))
	}
	endEpoch(t, job)
	q := kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend())).SetKey("k1")
	var got []int64
	must(t, attrs.Entries(q, func(k, v int64) error {
		if v != -k {
			return fmt.Errorf("entry %d = %d", k, v)
		}
		got = append(got, k)
		return nil
	}))
	if len(got) != n || !slices.IsSorted(got) || got[0] != 0 || got[n-1] != n-1 {
		t.Fatalf("%d entries (sorted %v), want 0…%d once each", len(got), slices.IsSorted(got), n-1)
	}
	stop := errors.New("stop")
	calls := 0
	if err := attrs.Entries(q, func(int64, int64) error {
		calls++
		if calls == 1500 {
			return stop
		}
		return nil
	}); err != stop || calls != 1500 {
		t.Fatalf("Entries stopped in the second chunk: %v after %d calls", err, calls)
	}
}

// testValueAll lists a value state's keys and values: every record key's,
// whatever the scope's key, and nothing of other states (values of other
// names, a map's entries); with the open epoch's writes in a job's scope,
// without them through a read store; expired values skipped, and an
// OnReadAndWrite expiry not extended.
func testValueAll(t *testing.T, kind string) {
	const ttl = 10 * time.Second
	count := kstate.Value("count", kstate.Int64())
	other := kstate.Value("count2", kstate.Int64())
	attrs := kstate.Map("attrs", kstate.String(), kstate.Int64())
	short := kstate.Value("short", kstate.Int64(), kstate.WithTTL(ttl, kstate.OnCreateAndWrite))
	job := newScope(t, kind)
	for _, kv := range []struct {
		key string
		n   int64
	}{{"k1", 1}, {"k10", 10}, {"k2", 2}, {"", 0}} {
		job.SetKey(kv.key)
		must(t, count.Set(job, kv.n))
		must(t, other.Set(job, -kv.n))
		must(t, short.Set(job, kv.n))
	}
	must(t, attrs.Put(job.SetKey("k3"), "x", 3))
	endEpoch(t, job)
	job.Advance(ttl / 2)
	must(t, count.Set(job.SetKey("k4"), 4)) // the open epoch
	must(t, short.Set(job, 4))
	job.Store().CommitRecord()

	all := func(s kstate.Scope, v *kstate.ValueState[int64]) []string {
		t.Helper()
		var got []string
		must(t, v.All(s, func(key []byte, n int64) error {
			got = append(got, fmt.Sprintf("%s=%d", key, n))
			return nil
		}))
		return got
	}
	if got, want := all(job, count), []string{"=0", "k1=1", "k2=2", "k4=4", "k10=10"}; !slices.Equal(got, want) {
		t.Fatalf("All in the job's scope = %q, want %q (shorter keys first)", got, want)
	}

	q := kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend())).SetKey("anything")
	if got, want := all(q, count), []string{"=0", "k1=1", "k2=2", "k10=10"}; !slices.Equal(got, want) {
		t.Fatalf("All through a read store = %q, want %q (committed only)", got, want)
	}
	job.Advance(ttl / 2) // the committed short values expire; k4's does not
	if got, want := all(job, short), []string{"k4=4"}; !slices.Equal(got, want) {
		t.Fatalf("All of a state with TTL = %q, want %q", got, want)
	}
	stop := errors.New("stop")
	n := 0
	if err := count.All(job, func([]byte, int64) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("All with fn failing = %v after %d calls, want fn's error after 1", err, n)
	}

	// All does not extend an OnReadAndWrite expiry: a read of every key
	// would write the whole state again.
	touched := kstate.Value("touched", kstate.Int64(), kstate.WithTTL(ttl, kstate.OnReadAndWrite))
	must(t, touched.Set(job.SetKey("k5"), 5))
	endEpoch(t, job)
	if got := all(job, touched); !slices.Equal(got, []string{"k5=5"}) {
		t.Fatalf("All of touched = %q", got)
	}
	job.Store().CommitRecord()
	if n := job.Store().DirtyLen(); n != 0 {
		t.Fatalf("All dirtied %d keys: it extended an OnReadAndWrite expiry", n)
	}
}

// testKeys lists the record keys holding a state, once each whatever its
// kind (a map's several entries, a TTL's kind), shorter first, and goes on
// past a key given; nothing of other states; the open epoch's keys in a
// job's scope, not through a read store.
func testKeys(t *testing.T, kind string) {
	count := kstate.Value("count", kstate.Int64())
	attrs := kstate.Map("attrs", kstate.String(), kstate.Int64())
	seen := kstate.List("seen", kstate.Int64(), kstate.WithTTL(time.Hour, kstate.OnCreateAndWrite))
	job := newScope(t, kind)
	for _, key := range []string{"b", "aa", "a", "", "ccc"} {
		job.SetKey(key)
		must(t, count.Set(job, 1))
		must(t, attrs.Put(job, "x", 1))
		must(t, attrs.Put(job, "y", 2))
		must(t, seen.Add(job, 1))
		must(t, seen.Add(job, 2))
	}
	must(t, attrs.Put(job.SetKey("only-attrs"), "z", 3))
	endEpoch(t, job)
	must(t, count.Set(job.SetKey("open"), 1)) // the open epoch
	job.Store().CommitRecord()

	keys := func(s kstate.Scope, name string, after []byte) []string {
		t.Helper()
		var got []string
		must(t, kstate.Keys(s, name, after, func(k []byte) error {
			got = append(got, string(k))
			return nil
		}))
		return got
	}
	want := []string{"", "a", "b", "aa", "ccc"}
	for _, name := range []string{"attrs", "seen"} {
		got := keys(job, name, nil)
		if name == "attrs" {
			if w := append(slices.Clone(want), "only-attrs"); !slices.Equal(got, w) {
				t.Fatalf("Keys of %s = %q, want %q", name, got, w)
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Keys of %s = %q, want %q", name, got, want)
		}
	}
	if got, w := keys(job, "count", nil), []string{"", "a", "b", "aa", "ccc", "open"}; !slices.Equal(got, w) {
		t.Fatalf("Keys of count in the job's scope = %q, want %q", got, w)
	}
	q := kstatetest.NewScope(kstate.NewReadStore(job.Store().Backend()))
	if got := keys(q, "count", nil); !slices.Equal(got, want) {
		t.Fatalf("Keys of count through a read store = %q, want %q (committed only)", got, want)
	}
	if got, w := keys(q, "attrs", []byte("b")), []string{"aa", "ccc", "only-attrs"}; !slices.Equal(got, w) {
		t.Fatalf("Keys of attrs after b = %q, want %q", got, w)
	}
	if got := keys(q, "nothing", nil); got != nil {
		t.Fatalf("Keys of a state no key holds = %q", got)
	}
	stop := errors.New("stop")
	n := 0
	if err := kstate.Keys(q, "seen", nil, func([]byte) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("Keys with fn failing = %v after %d calls, want fn's error after 1", err, n)
	}

	// A state whose TTL was added keeps entries of both kinds: its keys
	// are merged in order, once each, and a listing that goes on after
	// each key, one at a time, lists them all (found by review: one kind
	// after the other, paging skipped keys). More keys than a batch.
	plain := kstate.Value("mixed", kstate.Int64())
	withTTL := kstate.Value("mixed", kstate.Int64(), kstate.WithTTL(time.Hour, kstate.OnCreateAndWrite))
	var mixed []string
	for i := range 600 {
		key := fmt.Sprintf("m%03d", i)
		mixed = append(mixed, key)
		d := plain
		if i%3 == 0 {
			d = withTTL
		}
		must(t, d.Set(job.SetKey(key), 1))
		if i%7 == 0 {
			must(t, plain.Set(job, 1)) // a key of both kinds
		}
	}
	must(t, withTTL.Set(job.SetKey("m"), 1)) // shorter: first
	mixed = append([]string{"m"}, mixed...)
	endEpoch(t, job)
	if got := keys(job, "mixed", nil); !slices.Equal(got, mixed) {
		t.Fatalf("Keys of a state of both kinds: %d keys, want %d in order; first %q", len(got), len(mixed), got[:min(5, len(got))])
	}
	var paged []string
	var after []byte
	for {
		var k []byte
		err := kstate.Keys(job, "mixed", after, func(key []byte) error { k = bytes.Clone(key); return stop })
		if err == nil {
			break
		}
		if err != stop {
			t.Fatal(err)
		}
		paged, after = append(paged, string(k)), k
	}
	if !slices.Equal(paged, mixed) {
		t.Fatalf("Keys one at a time: %d keys, want %d", len(paged), len(mixed))
	}
}
