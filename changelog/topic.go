package changelog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TopicName is the changelog topic of an application. One topic serves all
// of an app's stores: the state name is part of every key, and one epoch
// marker per task then covers every store of the task atomically.
func TopicName(app string) string { return app + "-changelog" }

// ErrTopicMismatch is returned (wrapped) when an existing changelog topic
// has the wrong partition count or cleanup policy: restoring from it would
// mix tasks or lose state, so the instance must not start.
var ErrTopicMismatch = errors.New("changelog topic does not match")

// ErrTopicMissing is returned (wrapped) when the changelog topic does not
// exist and Ensure may not create it.
var ErrTopicMissing = errors.New("changelog topic missing")

// Ensure makes sure topic exists as a compacted topic with exactly
// partitions partitions, creating it if create is set and it is missing.
func Ensure(ctx context.Context, adm *kadm.Client, topic string, partitions int32, create bool) error {
	details, err := adm.ListTopics(ctx) // all topics: naming a missing one makes the client retry it for seconds
	if err != nil {
		return fmt.Errorf("changelog: list %s: %w", topic, err)
	}
	d, ok := details[topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		if !create {
			return fmt.Errorf("%w: %s does not exist and topic creation is off", ErrTopicMissing, topic)
		}
		cfg := map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}
		resp, err := adm.CreateTopic(ctx, partitions, -1, cfg, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("changelog: create %s: %w", topic, err)
		}
		// Validate what was made (by us or by another instance first),
		// once the metadata shows it: restores list its partitions.
		if d, err = awaitTopic(ctx, adm, topic); err != nil {
			return err
		}
	}
	if d.Err != nil {
		return fmt.Errorf("changelog: describe %s: %w", topic, d.Err)
	}
	if got := int32(len(d.Partitions)); got != partitions {
		return fmt.Errorf("%w: %s has %d partitions, the input topics have %d (a changelog partition belongs to one task; delete the topic and the state dirs to reset the app)", ErrTopicMismatch, topic, got, partitions)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return fmt.Errorf("changelog: describe configs of %s: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return fmt.Errorf("changelog: describe configs of %s: %w", topic, err)
	}
	if rc.Err != nil {
		return fmt.Errorf("changelog: describe configs of %s: %w", topic, rc.Err)
	}
	for _, c := range rc.Configs {
		if c.Key != "cleanup.policy" || c.Value == nil {
			continue
		}
		if !strings.Contains(*c.Value, "compact") {
			return fmt.Errorf("%w: %s has cleanup.policy=%s, want compact (deleted segments would lose state)", ErrTopicMismatch, topic, *c.Value)
		}
	}
	return nil
}

// awaitTopic waits until a just-created topic shows in the metadata with
// its partitions.
func awaitTopic(ctx context.Context, adm *kadm.Client, topic string) (kadm.TopicDetail, error) {
	backoff := 10 * time.Millisecond
	for {
		details, err := adm.ListTopics(ctx) // all topics: naming a missing one makes the client retry it for seconds
		if err != nil {
			return kadm.TopicDetail{}, fmt.Errorf("changelog: list %s: %w", topic, err)
		}
		if d, ok := details[topic]; ok && d.Err == nil && len(d.Partitions) > 0 {
			return d, nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return kadm.TopicDetail{}, ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}
