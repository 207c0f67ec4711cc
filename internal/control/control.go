// Package control is the format of an app's control topic, <app>-control:
// one compacted partition whose last record under StateKey says whether the
// app runs or is stopped, and, for a pipeline, whose last record under
// PipelineKey names its later stages. `processor savepoint --stop` writes "stopped" and
// `processor resume` writes "running"; every instance follows the topic,
// ends its work with a final checkpoint and leaves the group when the app is
// stopped, and does not join while it stays stopped.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// TopicName is the control topic of app.
func TopicName(app string) string { return app + "-control" }

// Create creates app's control topic (one compacted partition); one that
// exists already is fine. Instances create it at start, and the stopping
// tool for an app whose instances predate it.
func Create(ctx context.Context, adm *kadm.Client, app string) error {
	topic := TopicName(app)
	compact := "compact"
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": &compact}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create control topic %s: %w", topic, err)
	}
	return nil
}

// StateKey is the key of every state record; compaction keeps the last.
var StateKey = []byte("state")

// The states of an app.
const (
	Running = "running"
	Stopped = "stopped"
)

// State is the value of a state record.
type State struct {
	State string    `json:"state"` // Running or Stopped
	ID    string    `json:"id"`    // names the request, for logs
	At    time.Time `json:"at"`
}

// Encode is s as a record value.
func Encode(s State) []byte {
	b, _ := json.Marshal(s) // a struct of strings and a time: cannot fail
	return b
}

// Decode reads a record value; an unknown state is an error, so that a
// newer release's state is not taken for "running".
func Decode(b []byte) (State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("control: %w", err)
	}
	if s.State != Running && s.State != Stopped {
		return State{}, fmt.Errorf("control: unknown state %q", s.State)
	}
	return s, nil
}

// PipelineKey is the key of the record in which a pipeline names its later
// stages (Pipeline), so that `processor savepoint` knows them: topics
// named like a stage's could be another app's. Every start of a pipeline
// writes it; compaction keeps the last.
var PipelineKey = []byte("pipeline")

// Pipeline is the value of the PipelineKey record.
type Pipeline struct {
	Stages []string `json:"stages"` // the later stages' names, in order
}

// EncodePipeline is p as a record value.
func EncodePipeline(p Pipeline) []byte {
	b, _ := json.Marshal(p) // strings: cannot fail
	return b
}

// DecodePipeline reads a PipelineKey record's value.
func DecodePipeline(b []byte) (Pipeline, error) {
	var p Pipeline
	if err := json.Unmarshal(b, &p); err != nil {
		return Pipeline{}, fmt.Errorf("control: pipeline record: %w", err)
	}
	return p, nil
}
