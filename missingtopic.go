package sluice

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// A record to a topic that does not exist (one that EmitTo names and no one
// created, or a topic deleted while the instance runs) fails with
// UNKNOWN_TOPIC_OR_PARTITION once franz-go stops waiting for the topic's
// metadata, or keeps the checkpoint's flush waiting until its timeout. The
// epoch aborts and is replayed, and so is every epoch after it, until the
// topic exists: nothing is lost, but nothing commits either. As for a
// broker that is down, the instance says so in its log, at error level and
// naming the topic, and /readyz answers 503 until an epoch commits (or the
// tasks are released: their records are another owner's then).

// noteMissingTopic remembers topic if err says it does not exist (or no
// longer has the ID franz-go knew: deleted and created again). It runs on
// franz-go's promise goroutines.
func (in *Instance) noteMissingTopic(topic string, err error) {
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		in.missingTopic.Store(&topic)
		in.ready.Store(false)
	}
}

// logMissingTopic logs the topic that made the epoch fail, if one did since
// the last commit.
func (in *Instance) logMissingTopic() {
	if topic := in.missingTopic.Load(); topic != nil {
		in.log.Error("a topic the job writes to does not exist; its epochs abort and are replayed until it is created",
			"topic", *topic, "hint", "Sluice creates its output, dead-letter and side-output topics and its own; create the topics EmitTo and EmitToPartition name")
	}
}

// setReady stores whether the loop is ready, and stays not ready if a
// promise noted a missing topic meanwhile (its store of false could fall
// between the loop's load of missingTopic and its store of true).
func (in *Instance) setReady(ready bool) {
	in.ready.Store(ready && in.missingTopic.Load() == nil)
	if in.missingTopic.Load() != nil {
		in.ready.Store(false)
	}
}
