package changelog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/kstate"
)

// recordingBackend is a memory backend that remembers every Apply.
type recordingBackend struct {
	kstate.Backend
	sizes    []int
	bytes    []int // key and value bytes of each Apply
	unsorted int   // Applies whose mutations were not sorted by key
	metas    []kstate.Meta
	keys     [][][]byte // the first and last key of each Apply (none if empty)
}

func (b *recordingBackend) Apply(muts []kstate.Mutation, meta kstate.Meta) error {
	b.sizes = append(b.sizes, len(muts))
	n, sorted := 0, true
	for i, m := range muts {
		n += len(m.Key) + len(m.Value)
		sorted = sorted && (i == 0 || bytes.Compare(muts[i-1].Key, m.Key) < 0)
	}
	if !sorted {
		b.unsorted++
	}
	b.bytes = append(b.bytes, n)
	b.metas = append(b.metas, meta)
	var ends [][]byte
	if len(muts) > 0 {
		ends = [][]byte{bytes.Clone(muts[0].Key), bytes.Clone(muts[len(muts)-1].Key)}
	}
	b.keys = append(b.keys, ends)
	return b.Backend.Apply(muts, meta)
}

func entryKey(i int) []byte {
	return kstate.EncodeKey(kstate.KindKeyed, "count", []byte(fmt.Sprintf("k%05d", i)), nil)
}

// changelogWith writes epochs of keyed entries, each followed by its
// marker, then orphans (entries with no marker after them), as separate
// produce requests so each is its own batch for compaction.
//
// Compaction runs before the orphans are written, as it does in Kafka,
// which never cleans the active segment: an orphan is the newest record of
// its key, so compacting it away from the committed value before the next
// epoch rewrites the key is not a case a restore has to survive.
func changelogWith(t *testing.T, epochs, keysPerEpoch, orphans int) (*kfake.Cluster, *kgo.Client, *kadm.Client) {
	t.Helper()
	c, cl, adm, produce := newChangelog(t)
	for e := 1; e <= epochs; e++ {
		var recs []*kgo.Record
		for i := range keysPerEpoch {
			recs = append(recs, &kgo.Record{Key: entryKey((e-1)*keysPerEpoch + i), Value: []byte{byte(e)}})
		}
		produce(recs...)
		produce(&kgo.Record{Key: MarkerKey, Value: EncodeMarker(Marker{Epoch: uint64(e), Offsets: map[string]int64{"in": int64(e * 10)}})})
	}
	c.Compact()
	for i := range orphans {
		produce(&kgo.Record{Key: entryKey(i), Value: []byte("orphan")})
	}
	return c, cl, adm
}

// newChangelog starts a broker with a one-partition app-changelog topic,
// and returns a client that produces to it and a synchronous produce.
func newChangelog(t *testing.T) (*kfake.Cluster, *kgo.Client, *kadm.Client, func(...*kgo.Record)) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("app-changelog"), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := Ensure(ctx, adm, "app-changelog", 1, true); err != nil {
		t.Fatal(err)
	}
	produce := func(recs ...*kgo.Record) {
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return c, cl, adm, produce
}

func restoreInto(t *testing.T, cl *kgo.Client, adm *kadm.Client, be *recordingBackend, batch int) Result {
	t.Helper()
	return restoreWith(t, cl, adm, be, RestoreParams{BatchKeys: batch})
}

// restoreWith restores partition 0 of app-changelog into be with p's
// batch bounds.
func restoreWith(t *testing.T, cl *kgo.Client, adm *kadm.Client, be *recordingBackend, p RestoreParams) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p.Admin = adm
	p.ClientOpts = []kgo.Opt{kgo.SeedBrokers(cl.OptValue(kgo.SeedBrokers).([]string)...)}
	p.Topic, p.Partition, p.Apply = "app-changelog", 0, be.Apply
	res, err := Restore(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Defect 5: the restore applied only at markers, and compaction keeps one
// marker per partition, so a full restore of a compacted changelog held the
// whole partition in memory and wrote it in one transaction. Now batches
// are bounded whatever the markers; only the last is complete.
func TestRestoreBoundedAfterCompaction(t *testing.T) {
	_, cl, adm := changelogWith(t, 20, 100, 3)
	be := &recordingBackend{Backend: kstate.NewMemory()}
	res := restoreInto(t, cl, adm, be, 150)

	for i, n := range be.sizes {
		if n > 150 {
			t.Fatalf("apply %d wrote %d keys at once, bound 150 (all: %v)", i, n, be.sizes)
		}
	}
	last := be.metas[len(be.metas)-1]
	if last.Partial || last.Epoch != 20 || last.Offsets["in"] != 200 {
		t.Fatalf("last apply's meta %+v, want complete epoch 20", last)
	}
	for _, m := range be.metas[:len(be.metas)-1] {
		if !m.Partial {
			t.Fatalf("an apply before the last marker is not partial: %+v", m)
		}
	}
	if res.Last == nil || res.Last.Epoch != 20 {
		t.Fatalf("result's last marker %+v", res.Last)
	}
	if st := be.Stats(); st.Keys != 2000 {
		t.Fatalf("%d keys restored, want 2000", st.Keys)
	}
	// The orphans came after the last marker: reported, not applied.
	v, _, err := be.Get(entryKey(0))
	if err != nil || string(v) != "\x01" {
		t.Fatalf("k00000 = %q, %v; want its committed value", v, err)
	}
	var orphans []string
	for _, k := range res.Orphans {
		orphans = append(orphans, string(k))
	}
	sort.Strings(orphans)
	if len(orphans) != 3 || orphans[0] != string(entryKey(0)) || orphans[2] != string(entryKey(2)) {
		t.Fatalf("orphans %q", orphans)
	}
}

// Large values must not make a batch of BatchKeys records large: the bytes
// bound cuts it first. Every batch reaches the backend sorted by key (the
// restore sorts it), so the backend has nothing to sort.
func TestRestoreBatchesBoundedInBytes(t *testing.T) {
	_, cl, adm := changelogWith(t, 4, 100, 0)
	entry := len(entryKey(0)) + 1
	be := &recordingBackend{Backend: kstate.NewMemory()}
	res := restoreWith(t, cl, adm, be, RestoreParams{BatchKeys: 1000, BatchBytes: 40 * entry})
	for i, n := range be.sizes {
		if n > 40 || be.bytes[i] > 40*entry {
			t.Fatalf("apply %d wrote %d keys, %d bytes at once, bound %d bytes (all: %v)", i, n, be.bytes[i], 40*entry, be.sizes)
		}
	}
	if be.unsorted > 0 {
		t.Fatalf("%d of %d applies got mutations out of key order", be.unsorted, len(be.sizes))
	}
	if st := be.Stats(); st.Keys != 400 || res.Last == nil || res.Last.Epoch != 4 {
		t.Fatalf("%d keys restored, last marker %+v; want 400 and epoch 4", st.Keys, res.Last)
	}
}

// A restore from a partial store (a crash between two bounded batches)
// resumes where it stopped and completes it.
func TestRestoreResumesPartial(t *testing.T) {
	_, cl, adm := changelogWith(t, 5, 100, 0)
	be := &recordingBackend{Backend: kstate.NewMemory()}
	restoreInto(t, cl, adm, be, 150)
	partial := be.metas[0]
	if !partial.Partial {
		t.Fatalf("first batch not partial: %+v", partial)
	}

	again := &recordingBackend{Backend: kstate.NewMemory()}
	ctx := context.Background()
	res, err := Restore(ctx, RestoreParams{
		Admin:      adm,
		ClientOpts: []kgo.Opt{kgo.SeedBrokers(cl.OptValue(kgo.SeedBrokers).([]string)...)},
		Topic:      "app-changelog",
		From:       partial.ChangelogOffset,
		Apply:      again.Apply,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Last == nil || res.Last.Epoch != 5 || again.metas[len(again.metas)-1].Partial {
		t.Fatalf("resumed restore ended at %+v, %+v", res.Last, again.metas)
	}
}

// A slow broker is not a compacted tail: the restore waits for records that
// exist instead of skipping them after a silence (the old guess: 5 s).
func TestRestoreWaitsForASlowBroker(t *testing.T) {
	c, cl, adm := changelogWith(t, 3, 10, 0)
	slowed := false
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if slowed {
			return nil, nil, false
		}
		slowed = true
		c.SleepControl(func() { <-time.After(6 * time.Second) }) // the fault: a broker silent for 6s
		c.KeepControl()
		return nil, nil, false
	})
	be := &recordingBackend{Backend: kstate.NewMemory()}
	res := restoreInto(t, cl, adm, be, 0)
	if res.Last == nil || res.Last.Epoch != 3 || be.Stats().Keys != 30 {
		t.Fatalf("restored %d keys up to %+v, want 30 up to epoch 3", be.Stats().Keys, res.Last)
	}
}

// An aborted transaction larger than the first window read back from the
// end, with no marker after it: the restore ends at the last committed
// marker instead of waiting for records read_committed never shows.
func TestRestorePastALargeAbortedTransaction(t *testing.T) {
	c, cl, adm := changelogWith(t, 2, 10, 0)
	txn := openTransaction(t, c, "zombie")
	ctx := context.Background()
	var recs []*kgo.Record
	for i := range 6000 {
		recs = append(recs, &kgo.Record{Key: entryKey(i), Value: []byte("aborted")})
	}
	if err := txn.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := txn.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	be := &recordingBackend{Backend: kstate.NewMemory()}
	res := restoreInto(t, cl, adm, be, 0)
	if res.Last == nil || res.Last.Epoch != 2 || be.Stats().Keys != 20 || len(res.Orphans) != 0 {
		t.Fatalf("restored %d keys up to %+v with orphans %d, want 20 up to epoch 2 and none", be.Stats().Keys, res.Last, len(res.Orphans))
	}
}

// Admit is asked once, with the records to read, by a restore with more
// than a batch to read, before it applies anything, and released when the
// restore returns; a restore of a short tail is not held back by it, and
// one that Admit turns away applies nothing.
func TestRestoreAdmitsOnlyLongReads(t *testing.T) {
	_, cl, adm, produce := newChangelog(t)
	epoch := uint64(0)
	write := func(keys int) { // keys records and an epoch marker
		epoch++
		var recs []*kgo.Record
		for i := range keys {
			recs = append(recs, &kgo.Record{Key: entryKey(i), Value: []byte{byte(epoch)}})
		}
		produce(append(recs, &kgo.Record{Key: MarkerKey, Value: EncodeMarker(Marker{Epoch: epoch})})...)
	}
	be := &recordingBackend{Backend: kstate.NewMemory()}
	var asked []int64
	released, applied := 0, 0
	admit := func(_ context.Context, records int64) (func(), error) {
		if len(be.sizes) != applied {
			t.Errorf("Admit asked after %d applies", len(be.sizes)-applied)
		}
		asked = append(asked, records)
		return func() { released++ }, nil
	}
	restore := func(res Result) Result {
		applied = len(be.sizes)
		return restoreWith(t, cl, adm, be, RestoreParams{BatchKeys: 150, From: res.Next, Applied: res.Last, Admit: admit})
	}

	for range 10 {
		write(100)
	}
	res := restore(Result{})
	if !slices.Equal(asked, []int64{1010}) || released != 1 {
		t.Fatalf("a restore of 1,010 records asked Admit for %v and released %d times; want [1010] and 1", asked, released)
	}
	write(100) // 101 records: a short tail
	if res = restore(res); len(asked) != 1 || len(be.sizes) == applied || res.Last.Epoch != epoch {
		t.Fatalf("a restore of a 101-record tail asked Admit for %v, applied %d times and reached %+v", asked[1:], len(be.sizes)-applied, res.Last)
	}
	write(100)
	write(100) // 202 records: a long tail
	if res = restore(res); !slices.Equal(asked[1:], []int64{202}) || released != 2 || res.Last.Epoch != epoch {
		t.Fatalf("a restore of a 202-record tail asked Admit for %v, released %d times, reached %+v", asked[1:], released, res.Last)
	}

	// Turned away: the restore returns Admit's error and applies nothing.
	refused := errors.New("no turn")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fresh := &recordingBackend{Backend: kstate.NewMemory()}
	_, err := Restore(ctx, RestoreParams{
		Admin: adm, ClientOpts: []kgo.Opt{kgo.SeedBrokers(cl.OptValue(kgo.SeedBrokers).([]string)...)},
		Topic: "app-changelog", Apply: fresh.Apply, BatchKeys: 150,
		Admit: func(context.Context, int64) (func(), error) { return nil, refused },
	})
	if !errors.Is(err, refused) || len(fresh.sizes) != 0 {
		t.Fatalf("a restore Admit refused returned %v after %d applies; want %v and none", err, len(fresh.sizes), refused)
	}
}

// A live restore (a standby's round) reads to the last stable offset
// without waiting for the open transaction of the running task: it applies
// the epochs committed below it, leaves the entries after the last marker
// for the next round (no orphans), and the next round, from Result.Next,
// reads only what was committed since. The client it is given stays open.
func TestRestoreLiveBesideAnOpenTransaction(t *testing.T) {
	c, cl, adm := changelogWith(t, 2, 10, 0)
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: entryKey(100), Value: []byte("at-least-once tail")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	txn := openTransaction(t, c, "running-task")
	ctx := context.Background()
	epoch3 := []*kgo.Record{{Key: entryKey(0), Value: []byte("e3")}, {Key: entryKey(200), Value: []byte("e3")},
		{Key: MarkerKey, Value: EncodeMarker(Marker{Epoch: 3, Offsets: map[string]int64{"in": 30}})}}
	if err := txn.ProduceSync(ctx, epoch3...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	shared, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	be := &recordingBackend{Backend: kstate.NewMemory()}
	live := RestoreParams{Live: true, Client: shared, Group: "ignored", InputTopics: []string{"in"}}
	res := restoreWith(t, cl, adm, be, live)
	if res.Last == nil || res.Last.Epoch != 2 || be.Stats().Keys != 20 || len(res.Orphans) != 0 {
		t.Fatalf("first round: %d keys up to %+v, orphans %d; want 20 keys up to epoch 2 and no orphans", be.Stats().Keys, res.Last, len(res.Orphans))
	}
	if v, _, _ := be.Get(entryKey(100)); v != nil {
		t.Fatalf("the entry after the last marker was applied: %q", v)
	}
	// A copy past the last stable offset (a task's former member, whose
	// last epoch's commit marker has yet to land): nothing new, not a
	// copy ahead of its changelog.
	ends, err := adm.ListEndOffsets(ctx, "app-changelog")
	if err != nil {
		t.Fatal(err)
	}
	hwm, _ := ends.Lookup("app-changelog", 0)
	ahead := live
	ahead.From = hwm.Offset
	if res := restoreWith(t, cl, adm, &recordingBackend{Backend: kstate.NewMemory()}, ahead); res.Records != 0 || res.Next != hwm.Offset {
		t.Fatalf("a copy past the last stable offset read %d records and ends at %d, want none and %d", res.Records, res.Next, hwm.Offset)
	}
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	live.From, live.Applied = res.Next, res.Last
	res2 := restoreWith(t, cl, adm, be, live)
	if res2.Last == nil || res2.Last.Epoch != 3 || res2.Last.Offsets["in"] != 30 {
		t.Fatalf("second round ended at %+v, want epoch 3", res2.Last)
	}
	// The tail entry, epoch 3's two entries and its marker.
	if res2.Records != 4 {
		t.Fatalf("second round read %d records, want the 4 written after the first round's marker", res2.Records)
	}
	for key, want := range map[string]string{string(entryKey(0)): "e3", string(entryKey(200)): "e3", string(entryKey(100)): "at-least-once tail"} {
		if v, _, _ := be.Get([]byte(key)); string(v) != want {
			t.Fatalf("%q = %q after the second round, want %q", key, v, want)
		}
	}
	last := be.metas[len(be.metas)-1]
	if last.Epoch != 3 || last.ChangelogOffset != res2.Next || last.Partial {
		t.Fatalf("last meta %+v, want epoch 3 complete at %d", last, res2.Next)
	}
	if err := shared.Ping(ctx); err != nil {
		t.Fatalf("the shared client was closed by the restore: %v", err)
	}
}

// openTransaction begins a transaction of a producer to app-changelog with
// transactional id id; the test ends or aborts it.
func openTransaction(t *testing.T, c *kfake.Cluster, id string) *kgo.Client {
	t.Helper()
	txn, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("app-changelog"),
		kgo.TransactionalID(id), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(txn.Close)
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	return txn
}
