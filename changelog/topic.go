package changelog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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

// TopicInfo is what a running instance needs to know of its changelog
// topic's configuration.
type TopicInfo struct {
	// MaxMessageBytes is the topic's max.message.bytes: a state entry
	// larger than this can never be written to the changelog.
	MaxMessageBytes int
	// DeleteRetention is delete.retention.ms: how long compaction keeps a
	// tombstone. A local store older than this may have missed deletes.
	DeleteRetention time.Duration
}

// Kafka's defaults, for a broker that does not report a value.
const (
	defaultMaxMessageBytes = 1048588
	defaultDeleteRetention = 24 * time.Hour
)

// Ensure makes sure topic exists as a compacted topic with exactly
// partitions partitions, creating it if create is set and it is missing,
// and returns the parts of its configuration the instance works with.
func Ensure(ctx context.Context, adm *kadm.Client, topic string, partitions int32, create bool) (TopicInfo, error) {
	info := TopicInfo{MaxMessageBytes: defaultMaxMessageBytes, DeleteRetention: defaultDeleteRetention}
	details, err := adm.ListTopics(ctx) // all topics: naming a missing one makes the client retry it for seconds
	if err != nil {
		return info, fmt.Errorf("changelog: list %s: %w", topic, err)
	}
	d, ok := details[topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		if !create {
			return info, fmt.Errorf("%w: %s does not exist and topic creation is off", ErrTopicMissing, topic)
		}
		cfg := map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}
		resp, err := adm.CreateTopic(ctx, partitions, -1, cfg, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return info, fmt.Errorf("changelog: create %s: %w", topic, err)
		}
		// Validate what was made (by us or by another instance first),
		// once the metadata shows it: restores list its partitions.
		if d, err = awaitTopic(ctx, adm, topic); err != nil {
			return info, err
		}
	}
	if d.Err != nil {
		return info, fmt.Errorf("changelog: describe %s: %w", topic, d.Err)
	}
	if got := int32(len(d.Partitions)); got != partitions {
		return info, fmt.Errorf("%w: %s has %d partitions, the input topics have %d (a changelog partition belongs to one task; delete the topic and the state dirs to reset the app)", ErrTopicMismatch, topic, got, partitions)
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return info, fmt.Errorf("changelog: describe configs of %s: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		return info, fmt.Errorf("changelog: describe configs of %s: %w", topic, err)
	}
	if rc.Err != nil {
		return info, fmt.Errorf("changelog: describe configs of %s: %w", topic, rc.Err)
	}
	for _, c := range rc.Configs {
		if c.Value == nil {
			continue
		}
		switch c.Key {
		case "cleanup.policy":
			if !strings.Contains(*c.Value, "compact") {
				return info, fmt.Errorf("%w: %s has cleanup.policy=%s, want compact (deleted segments would lose state)", ErrTopicMismatch, topic, *c.Value)
			}
		case "max.message.bytes":
			if n, err := strconv.Atoi(*c.Value); err == nil && n > 0 {
				info.MaxMessageBytes = n
			}
		case "delete.retention.ms":
			if n, err := strconv.ParseInt(*c.Value, 10, 64); err == nil && n >= 0 {
				info.DeleteRetention = time.Duration(n) * time.Millisecond
			}
		}
	}
	return info, nil
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
