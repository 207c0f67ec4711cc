package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/check"
	"github.com/sluicehq/sluice/kstate"
)

// lastSeen holds, per key, the record's value and a nonce drawn at each
// processing: a replay of an aborted epoch writes other nonces than the
// attempt before it, so a value that no committed output carries can only
// have been read from an epoch that never committed.
var lastSeen = kstate.Value("last-seen", kstate.String())

// seenValues maps each of a key's values to its nonce: a map whose
// entries a query scans.
var seenValues = kstate.Map("seen-values", kstate.String(), kstate.String())

func nonceJob() sluice.Job {
	return sluice.Job{Name: "nonce", Emits: true, States: []string{lastSeen.Name(), seenValues.Name()},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			v := fmt.Sprintf("%s/%016x", rec.Value, rand.Uint64())
			if err := lastSeen.Set(ctx, v); err != nil {
				return err
			}
			if err := seenValues.Put(ctx, string(rec.Value), v); err != nil {
				return err
			}
			ctx.Emit(rec.Key, []byte(v))
			return nil
		}}
}

// queryInstance is an instance of the nonce job run in the background.
type queryInstance struct {
	*sluice.Instance
	id   string
	stop func() // Run must return nil
}

func startQueryInstance(t *testing.T, brokers []string, id, dir string, tweak func(*sluice.Options)) *queryInstance {
	t.Helper()
	o := testOptions(brokers, "query", nonceJob(), dir)
	o.InstanceID = id
	o.OutputTopic = "out"
	tweak(&o)
	inst, err := sluice.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &queryInstance{Instance: inst, id: id, stop: runInBackground(t, inst)}
}

// TestQueryReadsCommittedStateOnItsOwner queries two instances of a job
// while they process, while a third of their offset commits fail (each
// aborting its epoch) and while one of them stops and starts again, on
// both backends and with pipelined epochs. Every value a query returned is
// one that a committed output carries, and once the input is consumed each
// key is answered by exactly one instance, the one QueryOwner names, with
// the key's last committed output. The queries also scan a map state,
// reading other state and querying again from inside the scan, beside the
// tasks' applies and releases.
func TestQueryReadsCommittedStateOnItsOwner(t *testing.T) {
	for _, tt := range []struct {
		name  string
		tweak func(*sluice.Options)
	}{
		{"bbolt", func(*sluice.Options) {}},
		{"memory", func(o *sluice.Options) { o.Backend = kstate.MemoryBackend }},
		{"pipelined", func(o *sluice.Options) { o.PipelinedEpochs = true }},
		{"consumer-protocol", func(o *sluice.Options) { o.GroupProtocol = "consumer" }}, // QueryOwner describes a KIP-848 group
	} {
		t.Run(tt.name, func(t *testing.T) { testQueryReadsCommittedState(t, tt.tweak) })
	}
}

func testQueryReadsCommittedState(t *testing.T, tweak func(*sluice.Options)) {
	const keys, perKey = 40, 30
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var commits, aborted atomic.Int64
	c.ControlKey(int16(kmsg.TxnOffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if commits.Add(1)%3 != 0 {
			return nil, nil, false
		}
		aborted.Add(1)
		return check.TxnOffsetCommitError(kr, kerr.RebalanceInProgress), nil, true
	})
	brokers := c.ListenAddrs()
	dir := t.TempDir()
	insts := []*queryInstance{startQueryInstance(t, brokers, "q1", dir+"/q1", tweak), startQueryInstance(t, brokers, "q2", dir+"/q2", tweak)}
	var instMu sync.Mutex // insts[1] is replaced when q2 starts again
	inst := func(i int) *queryInstance {
		instMu.Lock()
		defer instMu.Unlock()
		return insts[i]
	}

	// Queries run all along, of every key on both instances.
	var (
		seenMu sync.Mutex
		seen   = map[string]map[string]bool{} // key → values queries returned
		reads  atomic.Int64
		nested atomic.Int64 // queries from inside a scan of a query
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			<-time.After(time.Millisecond) // pacing: the queries leave the instances a core
			key := fmt.Sprintf("k%02d", n%keys)
			qi := inst(n % 2)
			var v string
			var ok bool
			err := qi.Query([]byte(key), func(s kstate.Scope) error {
				var err error
				if v, ok, err = lastSeen.Get(s); err != nil || (n/2)%5 != 0 {
					return err
				}
				// Every fifth query of each instance: a scan whose
				// callback reads state and queries the task again.
				return seenValues.Entries(s, func(in, nonce string) error {
					if _, _, err := lastSeen.Get(s); err != nil {
						return err
					}
					err := qi.Query([]byte(key), func(s kstate.Scope) error {
						_, _, err := seenValues.Get(s, in)
						return err
					})
					if err == nil {
						nested.Add(1)
					}
					return err
				})
			})
			switch {
			case errors.Is(err, sluice.ErrNotLocal):
			case err != nil:
				t.Errorf("%s: query %s: %v", qi.id, key, err)
				return
			case ok:
				reads.Add(1)
				seenMu.Lock()
				if seen[key] == nil {
					seen[key] = map[string]bool{}
				}
				seen[key][v] = true
				seenMu.Unlock()
			}
		}
	})

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			for k := range keys {
				cl.Produce(context.Background(), &kgo.Record{Key: fmt.Appendf(nil, "k%02d", k), Value: fmt.Appendf(nil, "%d", i)}, nil)
			}
			if err := cl.Flush(context.Background()); err != nil { // a round at a time: more epochs
				t.Fatal(err)
			}
		}
	}
	awaitConsumed := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !consumedAll(adm, "query", n)(nil) {
			if time.Now().After(deadline) {
				t.Fatalf("%d records not consumed within a minute", n)
			}
			<-time.After(20 * time.Millisecond) // polling a condition, with a deadline
		}
	}

	produce(0, perKey/3)
	awaitConsumed(int64(keys * (perKey / 3)))
	inst(1).stop() // q1 takes every task
	produce(perKey/3, 2*perKey/3)
	awaitConsumed(int64(keys * (2 * perKey / 3)))
	instMu.Lock()
	insts[1] = startQueryInstance(t, brokers, "q2", dir+"/q2", tweak) // and gives some back
	instMu.Unlock()
	produce(2*perKey/3, perKey)
	awaitConsumed(keys * perKey)

	outs, err := check.ReadToEnd(context.Background(), brokers, "out", kgo.ReadCommitted())
	if err != nil {
		t.Fatal(err)
	}
	committed := map[string]map[string]bool{}
	last := map[string]string{}
	for _, r := range outs {
		k := string(r.Key)
		if committed[k] == nil {
			committed[k] = map[string]bool{}
		}
		committed[k][string(r.Value)] = true
		last[k] = string(r.Value)
	}
	for k := range keys {
		key := fmt.Sprintf("k%02d", k)
		if want := fmt.Sprintf("%d/", perKey-1); !strings.HasPrefix(last[key], want) {
			t.Fatalf("key %s: last committed output %q, want the last input %q first", key, last[key], want)
		}
	}

	// Settled: each key's last committed value, on exactly one instance,
	// the one the group assigns its task to.
	deadline := time.Now().Add(time.Minute)
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("k%02d", k)
		var got []string
		var owners []string
		for i := range 2 {
			qi := inst(i)
			err := qi.Query([]byte(key), func(s kstate.Scope) error {
				v, _, err := lastSeen.Get(s)
				got = append(got, v)
				return err
			})
			if err == nil {
				owners = append(owners, qi.id)
			} else if !errors.Is(err, sluice.ErrNotLocal) {
				t.Fatalf("%s: query %s: %v", qi.id, key, err)
			}
		}
		owner, err := inst(0).QueryOwner(context.Background(), []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if len(owners) != 1 || owners[0] != owner.InstanceID || got[0] != last[key] {
			if time.Now().After(deadline) {
				t.Fatalf("key %s: answered by %q with %q; QueryOwner says %+v; the last committed output is %q", key, owners, got, owner, last[key])
			}
			<-time.After(20 * time.Millisecond) // a rebalance or an apply still under way: ask again, with a deadline
			k--
			continue
		}
		if owner2, err := inst(1).QueryOwner(context.Background(), []byte(key)); err != nil || owner2 != owner {
			t.Fatalf("key %s: q2's QueryOwner = %+v, %v; q1's %+v", key, owner2, err, owner)
		}
	}
	close(stop)
	wg.Wait()

	for key, vs := range seen {
		for v := range vs {
			if !committed[key][v] {
				t.Errorf("key %s: a query returned %q, which no committed output carries", key, v)
			}
		}
	}
	t.Logf("%d reads of a value by queries, %d queries from inside a scan; %d of %d offset commits failed", reads.Load(), nested.Load(), aborted.Load(), commits.Load())
	if reads.Load() == 0 || nested.Load() == 0 || aborted.Load() == 0 {
		t.Fatalf("the test proved nothing: %d reads, %d nested queries, %d aborted commits", reads.Load(), nested.Load(), aborted.Load())
	}
}

// TestQueryRefusals: a query cannot write, an empty key has no partition,
// a partition out of range is refused, and an instance that is not running
// has no task.
func TestQueryRefusals(t *testing.T) {
	brokers, _ := inputCluster(t, 2, []*kgo.Record{{Key: []byte("a"), Value: []byte("1")}})
	o := testOptions(brokers, "refusals", nonceJob(), t.TempDir())
	o.OutputTopic = "out"
	inst, err := sluice.New(o)
	if err != nil {
		t.Fatal(err)
	}
	read := func(s kstate.Scope) error { _, _, err := lastSeen.Get(s); return err }
	var nl *sluice.NotLocalError
	if err := inst.Query([]byte("a"), read); !errors.As(err, &nl) || nl.Partition != -1 {
		t.Fatalf("Query before Run = %v, want a NotLocalError with partition -1", err)
	}
	if _, err := inst.QueryOwner(context.Background(), []byte("a")); !errors.Is(err, sluice.ErrNotLocal) {
		t.Fatalf("QueryOwner before Run = %v, want ErrNotLocal", err)
	}
	if err := inst.QueryLocal(func(int32, kstate.Scope) error { return nil }); !errors.As(err, &nl) || nl.Partition != -1 {
		t.Fatalf("QueryLocal before Run = %v, want a NotLocalError with partition -1", err)
	}
	defer runInBackground(t, inst)()
	deadline := time.Now().Add(time.Minute)
	for {
		var v string
		err := inst.Query([]byte("a"), func(s kstate.Scope) error {
			var err error
			v, _, err = lastSeen.Get(s)
			return err
		})
		tasks := 0
		if err == nil {
			err = inst.QueryLocal(func(int32, kstate.Scope) error { tasks++; return nil })
		}
		if err == nil && strings.HasPrefix(v, "1/") && tasks == 2 { // both tasks run here
			break
		}
		if err != nil && !errors.Is(err, sluice.ErrNotLocal) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record's state not queryable within a minute: %q, %v", v, err)
		}
		<-time.After(10 * time.Millisecond) // polling a condition, with a deadline
	}
	if err := inst.Query([]byte("a"), func(s kstate.Scope) error { return lastSeen.Set(s, "x") }); !errors.Is(err, kstate.ErrReadOnly) {
		t.Fatalf("a write in a query = %v, want ErrReadOnly", err)
	}
	if err := inst.Query(nil, read); err == nil || !strings.Contains(err.Error(), "QueryPartition") {
		t.Fatalf("Query of the empty key = %v", err)
	}
	if err := inst.QueryPartition(2, nil, read); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("QueryPartition(2) of 2 partitions = %v", err)
	}
	owner, err := inst.QueryOwner(context.Background(), []byte("a"))
	if err != nil || owner.InstanceID != "i1" {
		t.Fatalf("QueryOwner = %+v, %v; want i1", owner, err)
	}
	// QueryLocal reads both tasks here: every key's value, the one key
	// sent in its task.
	got := map[int32][]string{}
	if err := inst.QueryLocal(func(p int32, s kstate.Scope) error {
		got[p] = []string{}
		return lastSeen.All(s, func(key []byte, v string) error {
			got[p] = append(got[p], string(key)+"="+v[:2])
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	pa := int32(partitionOf([]byte("a")))
	if len(got) != 2 || len(got[1-pa]) != 0 || !slices.Equal(got[pa], []string{"a=1/"}) {
		t.Fatalf("QueryLocal read %q, want task %d with a=1/… and the other task empty", got, pa)
	}
	var other []byte // a key of the other partition, absent
	for i := 0; other == nil; i++ {
		if k := fmt.Appendf(nil, "b%d", i); partitionOf(k) != partitionOf([]byte("a")) {
			other = k
		}
	}
	if err := inst.Query(other, func(s kstate.Scope) error {
		if _, ok, err := lastSeen.Get(s); ok || err != nil {
			return fmt.Errorf("absent key read %v, %v", ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// partitionOf is the partition of 2 Kafka's default partitioner gives key.
func partitionOf(key []byte) int {
	return kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: key}, 2)
}

// BenchmarkQuery reads one key's value through Instance.Query on a running
// instance of the nonce job, 10,000 keys in 4 tasks, from GOMAXPROCS
// goroutines: go test -run '^$' -bench Query -benchtime 200000x .
func BenchmarkQuery(b *testing.B) {
	const keys = 10000
	var recs []*kgo.Record
	for k := range keys {
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", k), Value: []byte("1")})
	}
	for _, backend := range []string{kstate.BoltBackend, kstate.MemoryBackend} {
		b.Run(backend, func(b *testing.B) {
			brokers, adm := inputCluster(b, 4, recs)
			o := testOptions(brokers, "bench-query", nonceJob(), b.TempDir())
			o.OutputTopic, o.Backend = "out", backend
			inst, err := sluice.New(o)
			if err != nil {
				b.Fatal(err)
			}
			defer runInBackground(b, inst)()
			// Every key processed and applied: the tasks list them all.
			applied := func() bool {
				n := 0
				err := inst.QueryLocal(func(_ int32, s kstate.Scope) error {
					return lastSeen.All(s, func([]byte, string) error { n++; return nil })
				})
				return err == nil && n == keys && inst.PartitionOf([]byte("k0")) >= 0
			}
			deadline := time.Now().Add(time.Minute)
			for !consumedAll(adm, "bench-query", keys)(inst) || !applied() {
				if time.Now().After(deadline) {
					b.Fatal("the keys were not processed within a minute")
				}
				<-time.After(10 * time.Millisecond) // polling a condition, with a deadline
			}
			var missing atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := 0
				for pb.Next() {
					n++
					key := fmt.Appendf(nil, "k%d", n%keys)
					err := inst.Query(key, func(s kstate.Scope) error {
						_, ok, err := lastSeen.Get(s)
						if !ok {
							missing.Add(1)
						}
						return err
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			if missing.Load() > 0 {
				b.Fatalf("%d queries found no value", missing.Load())
			}
		})
	}
}
