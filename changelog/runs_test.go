package changelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// randomChangelog writes epochs of writes to keys drawn at random from
// keySpace (values name the epoch and the write; one write in seven is a
// tombstone, one in fourteen an empty value), each epoch followed by its
// marker. The first half is
// compacted (one record a key, as a long-running app's log begins); the
// second half keeps every write, so a key's values and tombstones land in
// different batches. Orphans (no marker after them) follow, as in
// changelogWith. It returns, beside the clients, the state the changelog
// holds: each key's last value up to the last marker.
func randomChangelog(t *testing.T, epochs, perEpoch, keySpace, orphans int) (*kgo.Client, *kadm.Client, map[string]string) {
	t.Helper()
	c, cl, adm, produce := newChangelog(t)
	rng := rand.New(rand.NewPCG(7, 9))
	want := map[string]string{}
	for e := 1; e <= epochs; e++ {
		var recs []*kgo.Record
		for i := range perEpoch {
			r := &kgo.Record{Key: entryKey(rng.IntN(keySpace))}
			switch rng.IntN(14) {
			case 0, 1:
			case 2:
				r.Value = []byte{} // empty, not a tombstone
			default:
				r.Value = []byte{byte(e), byte(i)}
			}
			if r.Value == nil {
				delete(want, string(r.Key))
			} else {
				want[string(r.Key)] = string(r.Value)
			}
			recs = append(recs, r)
		}
		produce(recs...)
		produce(&kgo.Record{Key: MarkerKey, Value: EncodeMarker(Marker{Epoch: uint64(e), Offsets: map[string]int64{"in": int64(e * 10)}})})
		if e == epochs/2 {
			c.Compact()
		}
	}
	for i := range orphans {
		produce(&kgo.Record{Key: entryKey(i), Value: []byte("orphan")})
	}
	return cl, adm, want
}

// state is every key and value of be.
func state(t *testing.T, be kstate.Backend) map[string]string {
	t.Helper()
	m := map[string]string{}
	if err := be.Scan(nil, func(k, v []byte) error {
		m[string(k)] = string(v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

func sameOrphans(a, b [][]byte) bool {
	sa, sb := slices.Clone(a), slices.Clone(b)
	slices.SortFunc(sa, bytes.Compare)
	slices.SortFunc(sb, bytes.Compare)
	return slices.EqualFunc(sa, sb, bytes.Equal)
}

// A restore that sorts (RunsDir) ends in the same state (the one the
// changelog holds), with the same result, as one that applies batches as
// they come, over a changelog in
// random key order with overwrites, tombstones and orphans, into memory
// and into bbolt; with fewer runs than a merge reads, its applies reach the
// backend in ascending key order across all of them (one merge), and with
// more, the earlier runs are merged into the backend first. It leaves no
// runs behind.
func TestRestoreSortedMatchesDirect(t *testing.T) {
	cl, adm, want := randomChangelog(t, 30, 200, 1500, 5)
	entry := len(entryKey(0)) + 2 + runEntryOverhead
	for _, tc := range []struct {
		name     string
		runKeys  int // entries of a run
		backend  string
		oneMerge bool
	}{
		{"one merge", 100, kstate.MemoryBackend, true},
		{"one merge into bbolt", 100, kstate.BoltBackend, true},
		{"more runs than a merge reads", 20, kstate.MemoryBackend, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bounds := RestoreParams{BatchKeys: 50, BatchBytes: tc.runKeys * entry}
			direct := &recordingBackend{Backend: kstatetest.MustOpen(t, tc.backend)}
			wantRes := restoreWith(t, cl, adm, direct, bounds)

			runs := filepath.Join(t.TempDir(), "runs")
			sorted := &recordingBackend{Backend: kstatetest.MustOpen(t, tc.backend)}
			p := bounds
			p.RunsDir = runs
			got := restoreWith(t, cl, adm, sorted, p)

			if ws := state(t, direct); !maps.Equal(ws, want) {
				t.Fatalf("direct restore: %d keys, the changelog holds %d; they differ", len(ws), len(want))
			}
			if gs := state(t, sorted); !maps.Equal(gs, want) {
				t.Fatalf("sorted restore: %d keys, the changelog holds %d; they differ", len(gs), len(want))
			}
			if got.Last == nil || wantRes.Last == nil || got.Last.Epoch != wantRes.Last.Epoch || got.Next != wantRes.Next || got.Records != wantRes.Records || !sameOrphans(got.Orphans, wantRes.Orphans) {
				t.Fatalf("sorted result %+v, direct %+v", got, wantRes)
			}
			if direct.unsorted != 0 || sorted.unsorted != 0 {
				t.Fatalf("applies not in key order: %d direct, %d sorted", direct.unsorted, sorted.unsorted)
			}
			if ds, ss := direct.Stats(), sorted.Stats(); ds.Keys != ss.Keys || ds.Bytes != ss.Bytes {
				t.Fatalf("stats: sorted %+v, direct %+v", ss, ds)
			}
			if m := sorted.metas[len(sorted.metas)-1]; m.Partial || m.Epoch != 30 {
				t.Fatalf("last apply's meta %+v, want complete epoch 30", m)
			}
			for i, n := range sorted.sizes {
				if n > bounds.BatchKeys || sorted.bytes[i] > bounds.BatchBytes {
					t.Fatalf("apply %d wrote %d keys, %d bytes: over the bounds", i, n, sorted.bytes[i])
				}
			}
			ascending := true
			for i := 1; i < len(sorted.keys); i++ {
				prev, cur := sorted.keys[i-1], sorted.keys[i]
				if len(prev) > 0 && len(cur) > 0 && bytes.Compare(prev[1], cur[0]) >= 0 {
					ascending = false
				}
			}
			if ascending != tc.oneMerge {
				t.Fatalf("applies in ascending key order across all of them: %v, want %v", ascending, tc.oneMerge)
			}
			if _, err := os.Stat(runs); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("runs dir after the restore: %v", err)
			}
		})
	}
}

// Over a changelog in key order, sorting costs nothing: the batches are
// applied as they come, the same batches as without RunsDir.
func TestRestoreSortedInOrderWritesNoRuns(t *testing.T) {
	_, cl, adm := changelogWith(t, 10, 100, 3)
	direct := &recordingBackend{Backend: kstate.NewMemory()}
	restoreInto(t, cl, adm, direct, 150)
	sorted := &recordingBackend{Backend: kstate.NewMemory()}
	restoreWith(t, cl, adm, sorted, RestoreParams{BatchKeys: 150, RunsDir: filepath.Join(t.TempDir(), "runs")})
	if !slices.Equal(direct.sizes, sorted.sizes) || !slices.EqualFunc(direct.metas, sorted.metas, func(a, b kstate.Meta) bool {
		return a.ChangelogOffset == b.ChangelogOffset && a.Partial == b.Partial
	}) {
		t.Fatalf("applies of %v keys, without sorting %v (or at other offsets)", sorted.sizes, direct.sizes)
	}
	if !maps.Equal(state(t, direct), state(t, sorted)) {
		t.Fatal("states differ")
	}
}

// A sorted restore that fails during its merge leaves a Partial meta from
// which a restore without sorting (the backend holds state now) completes
// it to the same state as a restore that never failed.
func TestRestoreSortedResumesAfterAFailedMerge(t *testing.T) {
	cl, adm, _ := randomChangelog(t, 20, 200, 1000, 0)
	entry := len(entryKey(0)) + 2
	bounds := RestoreParams{BatchKeys: 40, BatchBytes: 50 * entry}
	direct := &recordingBackend{Backend: kstate.NewMemory()}
	restoreWith(t, cl, adm, direct, bounds)

	be := &recordingBackend{Backend: kstate.NewMemory()}
	failAt := 4 // the first applies the leading batch; the merge fails mid-way
	calls := 0
	p := bounds
	p.Admin, p.Topic, p.RunsDir = adm, "app-changelog", filepath.Join(t.TempDir(), "runs")
	p.ClientOpts = []kgo.Opt{kgo.SeedBrokers(cl.OptValue(kgo.SeedBrokers).([]string)...)}
	p.Apply = func(muts []kstate.Mutation, meta kstate.Meta) error {
		if calls++; calls == failAt {
			return errors.New("disk full")
		}
		return be.Apply(muts, meta)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := Restore(ctx, p); err == nil {
		t.Fatal("the restore did not report the failed apply")
	}
	meta := be.metas[len(be.metas)-1]
	if !meta.Partial || be.Stats().Keys == 0 {
		t.Fatalf("after the failure: meta %+v, %d keys; want a partial store", meta, be.Stats().Keys)
	}
	again := bounds
	again.From = meta.ChangelogOffset
	res := restoreWith(t, cl, adm, be, again)
	if res.Last == nil || res.Last.Epoch != 20 || !maps.Equal(state(t, direct), state(t, be)) {
		t.Fatalf("resumed restore ended at %+v with a different state", res.Last)
	}
	if ds, bs := direct.Stats(), be.Stats(); ds.Keys != bs.Keys || ds.Bytes != bs.Bytes {
		t.Fatalf("stats: resumed %+v, direct %+v", bs, ds)
	}
}

// A cancelled restore stops its merge at the next batch: a task given away
// during a restore from scratch does not hold the loop for the whole
// partition.
func TestRestoreSortedMergeStopsWhenCancelled(t *testing.T) {
	cl, adm, _ := randomChangelog(t, 20, 200, 1000, 0)
	be := &recordingBackend{Backend: kstate.NewMemory()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	calls := 0
	_, err := Restore(ctx, RestoreParams{
		Admin:      adm,
		ClientOpts: []kgo.Opt{kgo.SeedBrokers(cl.OptValue(kgo.SeedBrokers).([]string)...)},
		Topic:      "app-changelog",
		BatchKeys:  20,
		RunsDir:    filepath.Join(t.TempDir(), "runs"),
		Apply: func(muts []kstate.Mutation, meta kstate.Meta) error {
			if calls++; calls == 2 {
				cancel() // a rebalance took the task
			}
			return be.Apply(muts, meta)
		},
	})
	if !errors.Is(err, context.Canceled) || calls != 2 {
		t.Fatalf("after the cancel: %v, %d applies; want context.Canceled after 2", err, calls)
	}
}

// A restore that reads its partition twice (the group's offsets were ahead:
// the first epoch was still landing) keeps what it read after the last
// marker, none in the first round, and adds it to the batch once the
// second round finds a marker after it. The tail is a map, so of a key
// written twice it holds the later write; sorting, its entries join the
// batch's list in key order, and are applied in sorted applies. Either way
// the state is the one a restore in one round reaches.
func TestRestoreSortedTwoRounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []int
	}{
		{"in key order", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}},
		{"keys written twice", []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 3, 12, 0, 11}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cl, adm, produce := newChangelog(t)
			ctx := context.Background()
			if _, err := adm.CreateTopic(ctx, 1, 1, nil, "in"); err != nil {
				t.Fatal(err)
			}
			for i, k := range tc.keys {
				produce(&kgo.Record{Key: entryKey(k), Value: []byte{byte(i)}})
			}
			var offs kadm.Offsets
			offs.AddOffset("in", 0, 10, -1)
			if _, err := adm.CommitOffsets(ctx, "g", offs); err != nil {
				t.Fatal(err)
			}
			marker := &kgo.Record{Key: MarkerKey, Value: EncodeMarker(Marker{Epoch: 1, Offsets: map[string]int64{"in": 10}})}
			rounds := 1
			sorted := &recordingBackend{Backend: kstate.NewMemory()}
			got := restoreWith(t, cl, adm, sorted, RestoreParams{
				Group: "g", InputTopics: []string{"in"}, RunsDir: filepath.Join(t.TempDir(), "runs"),
				Logf: func(msg string, _ ...any) {
					if strings.Contains(msg, "re-reading") && rounds == 1 {
						rounds++
						produce(marker) // the epoch lands
					}
				},
			})
			if rounds != 2 || got.Last == nil || got.Last.Epoch != 1 || len(got.Orphans) != 0 {
				t.Fatalf("%d rounds, result %+v; want 2 rounds ending at epoch 1 with no orphans", rounds, got)
			}
			direct := &recordingBackend{Backend: kstate.NewMemory()}
			restoreWith(t, cl, adm, direct, RestoreParams{})
			if ws, gs := state(t, direct), state(t, sorted); len(ws) == 0 || !maps.Equal(ws, gs) {
				t.Fatalf("two rounds, sorting: %v; one round: %v", gs, ws)
			}
			if sorted.unsorted != 0 {
				t.Fatalf("%d applies were not in key order", sorted.unsorted)
			}
		})
	}
}

// batchLen: BatchKeys, or what BatchBytes leaves room for at the batch's
// mean entry size (rounded down), and never more than the records left.
func TestBatchLenFollowsTheBounds(t *testing.T) {
	r := &restorer{p: RestoreParams{BatchKeys: 10000, BatchBytes: 1 << 20}, end: 1 << 40}
	r.ents = make([]logEntry, 2000)
	r.batchBytes = 2000 * 40
	if got := r.batchLen(); got != 10000 {
		t.Errorf("in key order, small entries: %d, want BatchKeys", got)
	}
	r.ents = make([]logEntry, 500)
	r.batchBytes = 500 * 1000
	if got, want := r.batchLen(), (1<<20)/1000+1; got != want {
		t.Errorf("in key order, large entries: %d, want %d", got, want)
	}
	r.sorting, r.outOfOrder = true, true
	r.ents = make([]logEntry, 2000)
	r.batchBytes = 2000 * 40
	if got, want := r.batchLen(), (1<<20)/(40+runEntryOverhead)+1; got != want {
		t.Errorf("for a run: %d, want %d", got, want)
	}
	r.pos = r.end - 300 // 300 records left to read
	if got, want := r.batchLen(), 2000+1+300; got != want {
		t.Errorf("300 records left: %d, want %d", got, want)
	}
	r.pos = r.end
	r.batchBytes = 2000 << 20 // past the bounds already: one more
	if got := r.batchLen(); got != len(r.ents)+1 {
		t.Errorf("past the bounds: %d, want %d", got, len(r.ents)+1)
	}
}

// Holding records until the batch is full grows it once past growAfter
// (not by doubling), to no more than the flush needs; a short restore's
// batch is sized by its records, not by the bounds.
func TestBatchGrowsOnce(t *testing.T) {
	for _, c := range []struct {
		name      string
		sorted    bool
		records   int // left to read; 0: more than the batch takes
		valueSize int
	}{
		{"in key order", true, 0, 30},
		{"in key order, large values", true, 0, 3000},
		{"a run", false, 0, 30},
		{"a run, large values", false, 0, 3000},
		{"a run, 2,000 records", false, 2000, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &restorer{p: RestoreParams{BatchKeys: 10000, BatchBytes: 16 << 20}, sorting: true, outOfOrder: !c.sorted, end: 1 << 40}
			if c.records > 0 {
				r.end = int64(c.records)
			}
			value := make([]byte, c.valueSize)
			grows, held := 0, 0
			for i := 0; c.records == 0 || i < c.records; i++ {
				before := cap(r.ents)
				r.hold(fmt.Appendf(nil, "key-%08d", i), value)
				r.pos = int64(i) + 1
				held++
				if cap(r.ents) != before && before >= growAfter {
					grows++
				}
				if r.full() {
					break
				}
			}
			if grows > 1 {
				t.Errorf("grew %d times past %d entries; want once", grows, growAfter)
			}
			if held > growAfter && cap(r.ents) > 2*held {
				t.Errorf("%d entries held in a batch of capacity %d", held, cap(r.ents))
			}
		})
	}
}

// The buffers a restore gives back for the next one point to nothing of
// its batch, over their whole capacity.
func TestReleasedBuffersHoldNothing(t *testing.T) {
	var r restorer
	for i := range 3 {
		r.hold([]byte{byte(i)}, []byte("value"))
	}
	r.sortedBatch()
	r.ents, r.muts = r.ents[:1], r.muts[:1] // past the length they are kept too
	b := r.releaseBuffers()
	if r.ents != nil || r.muts != nil {
		t.Error("the restorer still has its buffers")
	}
	for i, e := range b.ents[:cap(b.ents)] {
		if e.Key != nil || e.Value != nil || e.seq != 0 {
			t.Errorf("entry %d holds %+v", i, e)
		}
	}
	for i, m := range b.muts[:cap(b.muts)] {
		if m.Key != nil || m.Value != nil {
			t.Errorf("mutation %d holds %+v", i, m)
		}
	}
	if len(b.ents) != 0 || len(b.muts) != 0 || cap(b.ents) < 3 || cap(b.muts) < 3 {
		t.Errorf("buffers of length %d and %d, capacity %d and %d", len(b.ents), len(b.muts), cap(b.ents), cap(b.muts))
	}
	if (&restorer{}).releaseBuffers() != nil {
		t.Error("a restorer with no buffers gave some")
	}
}
