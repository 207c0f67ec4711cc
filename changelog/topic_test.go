package changelog

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestEnsure(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "three"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.MetadataMinAge(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 3, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, "deleting"); err != nil {
		t.Fatal(err)
	}

	if _, err := Ensure(ctx, adm, "app-changelog", 3, true); err != nil {
		t.Fatalf("create: %v", err)
	}
	if _, err := Ensure(ctx, adm, "app-changelog", 3, false); err != nil {
		t.Fatalf("existing, valid: %v", err)
	}
	for _, tt := range []struct {
		name, topic string
		parts       int32
		create      bool
		want        error
	}{
		{"wrong partition count", "app-changelog", 4, true, ErrTopicMismatch},
		{"not compacted", "deleting", 3, true, ErrTopicMismatch},
		{"missing, creation off", "missing-changelog", 3, false, ErrTopicMissing},
	} {
		if _, err := Ensure(ctx, adm, tt.topic, tt.parts, tt.create); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
}
