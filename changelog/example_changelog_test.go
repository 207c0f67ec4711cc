package changelog_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// A marker ends a task's epoch in its changelog partition: the epoch, the
// next input offsets and the watermark. Equal markers encode to equal bytes.
func ExampleEncodeMarker() {
	m := changelog.Marker{
		Epoch:     42,
		Offsets:   map[string]int64{"page-views": 1200},
		Watermark: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC),
	}
	b := changelog.EncodeMarker(m)
	back, err := changelog.DecodeMarker(b)
	fmt.Println(back.Epoch, back.Offsets, back.Watermark.UTC().Format(time.RFC3339), err)
	fmt.Println(changelog.IsMarker(changelog.MarkerKey), changelog.TopicName("views"))
	// Output:
	// 42 map[page-views:1200] 2026-01-01T12:00:00Z <nil>
	// true views-changelog
}

// views is the state the changelog below carries; a restore fills it.
var views = kstate.Value("views", kstate.Int64())

// Restoring a task's store from its changelog partition, as a tool that
// inspects an app's state would: the records of one epoch, its marker, and
// a record after the last marker, which is not part of any committed epoch.
func ExampleRestore() {
	cluster, _ := kfake.NewCluster(kfake.NumBrokers(1))
	defer cluster.Close()
	cl, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("views-changelog"),
		kgo.MetadataMinAge(50*time.Millisecond)) // the topic is created just below
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The engine's side: a compacted topic with the input's partition count.
	if _, err := changelog.Ensure(ctx, adm, "views-changelog", 1, true); err != nil {
		fmt.Println(err)
		return
	}
	entry := func(user string, n int64) *kgo.Record {
		v, _ := kstate.Int64().Encode(n)
		return &kgo.Record{Key: kstate.EncodeKey(kstate.KindKeyed, views.Name(), []byte(user), nil), Value: v}
	}
	marker := &kgo.Record{Key: changelog.MarkerKey, Value: changelog.EncodeMarker(changelog.Marker{Epoch: 1, Offsets: map[string]int64{"page-views": 3}})}
	cl.ProduceSync(ctx, entry("ann", 2), entry("bob", 1), marker, entry("ann", 3))

	be := kstate.NewMemory()
	res, err := changelog.Restore(ctx, changelog.RestoreParams{
		Admin:      adm,
		ClientOpts: []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)},
		Topic:      "views-changelog",
		Partition:  0,
		Apply:      be.Apply,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("epoch %d, input offsets %v, %d orphan\n", res.Last.Epoch, res.Last.Offsets, len(res.Orphans))
	sc := kstatetest.NewScope(kstate.NewStore(be))
	for _, user := range []string{"ann", "bob"} {
		n, _, _ := views.Get(sc.SetKey(user))
		fmt.Println(user, n)
	}
	// Output:
	// epoch 1, input offsets map[page-views:3], 1 orphan
	// ann 2
	// bob 1
}
