package savepoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"
)

// FormatVersion is the version of the manifest and data file layout this
// package writes and reads for the savepoint of one job.
const FormatVersion = 1

// FormatPipeline is the format of a pipeline's savepoint: its first stage's
// savepoint, as FormatVersion, whose manifest lists the later stages
// (Manifest.Stages), each a FormatVersion savepoint in a directory of its
// own under it. A release that reads only FormatVersion refuses it rather
// than restore the first stage alone.
const FormatPipeline = 2

// ManifestName is the manifest's file name in a savepoint directory (or
// its key under an object store prefix).
const ManifestName = "manifest.json"

// CodecUnknown is a state's codec when the savepoint was taken from Kafka
// alone: the changelog holds codec bytes, not the codec's name.
const CodecUnknown = "unknown"

// Errors of Open, Verify and Scan.
var (
	// ErrIncomplete is returned (wrapped) by Open for a location without a
	// manifest: a savepoint still being written, or one whose writer died.
	ErrIncomplete = errors.New("savepoint: incomplete (no manifest)")
	// ErrFormat is returned (wrapped) for a manifest or data file this
	// package cannot read: another format version, bad magic, a truncated
	// or malformed entry, keys out of order, a key count that disagrees.
	ErrFormat = errors.New("savepoint: bad format")
	// ErrChecksum is returned (wrapped) when a data file's size or SHA-256
	// differs from the manifest's: the file was changed or damaged.
	ErrChecksum = errors.New("savepoint: data file checksum mismatch")
)

// Manifest describes a savepoint. It is the JSON document manifest.json.
type Manifest struct {
	Format int    `json:"format"`
	AppID  string `json:"app_id"`
	// Job is the job's name, "" when not known: a savepoint taken from
	// Kafka alone does not know it (the changelog does not record it).
	Job            string    `json:"job"`
	Created        time.Time `json:"created"`
	ChangelogTopic string    `json:"changelog_topic"`
	// Inputs are the input topics named in the tasks' epoch markers.
	Inputs []Input `json:"inputs"`
	// States are the state names found in the entries, with their kinds.
	States []State `json:"states"`
	// Tasks are ordered by partition.
	Tasks []Task `json:"tasks"`
	// Stages are the later stages of a pipeline (FormatPipeline), sorted
	// by name; none for the savepoint of one job.
	Stages []Stage `json:"stages,omitempty"`
}

// Stage is a later stage of a pipeline in its savepoint: the stage's name
// and the directory (or key prefix) under the savepoint's location that
// holds its own savepoint, of the stage's app id <app>-<name>. Join(the
// savepoint's location, Dir) opens it.
type Stage struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
}

// StageDir is the directory of a pipeline stage's savepoint under the
// pipeline's.
func StageDir(name string) string { return "stage-" + name }

// Input is an input topic and its partition count when the savepoint was
// taken (that of the changelog, which always has the input's count).
type Input struct {
	Topic      string `json:"topic"`
	Partitions int32  `json:"partitions"`
}

// State is one state found in the savepoint. Codec is CodecUnknown when
// taken from Kafka: a restore can then check names and kinds, not codecs.
type State struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"` // kstate.Kind's String: keyed, keyed-ttl, timer, operator
	Codec string `json:"codec"`
}

// Task is one task's part of the savepoint: its cut (the last committed
// epoch) and its data file.
type Task struct {
	Partition int32            `json:"partition"`
	Epoch     uint64           `json:"epoch"`
	Offsets   map[string]int64 `json:"offsets"`
	// Watermark is the event-time watermark in unix milliseconds, nil when
	// the task has none.
	Watermark *int64 `json:"watermark"`
	Keys      int64  `json:"keys"`
	File      string `json:"file"`
	Bytes     int64  `json:"bytes"`
	SHA256    string `json:"sha256"` // lower-case hex
}

// WatermarkTime is the task's watermark as a time, zero when it has none.
func (t Task) WatermarkTime() time.Time {
	if t.Watermark == nil {
		return time.Time{}
	}
	return time.UnixMilli(*t.Watermark)
}

// writeManifest writes m as the manifest, atomically (store.PutAtomic),
// so that after a crash the manifest either is whole or is not there.
func writeManifest(ctx context.Context, st store, m Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("savepoint: encode manifest: %w", err)
	}
	if err := st.PutAtomic(ctx, ManifestName, append(b, '\n')); err != nil {
		return fmt.Errorf("savepoint: write manifest: %w", err)
	}
	return nil
}

func readManifest(ctx context.Context, st store, where string) (Manifest, error) {
	r, err := st.Open(ctx, ManifestName)
	if errors.Is(err, errNotFound) {
		return Manifest{}, fmt.Errorf("%w: %s", ErrIncomplete, where)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("savepoint: %w", err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		return Manifest{}, fmt.Errorf("savepoint: %s: %w", where, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: manifest of %s: %v", ErrFormat, where, err)
	}
	switch {
	case m.Format != FormatVersion && m.Format != FormatPipeline:
		return Manifest{}, fmt.Errorf("%w: manifest of %s has format %d, this release reads %d and %d", ErrFormat, where, m.Format, FormatVersion, FormatPipeline)
	case (m.Format == FormatPipeline) != (len(m.Stages) > 0):
		return Manifest{}, fmt.Errorf("%w: manifest of %s has format %d and %d stages", ErrFormat, where, m.Format, len(m.Stages))
	}
	for _, st := range m.Stages {
		if st.Dir != StageDir(st.Name) || st.Name == "" || strings.ContainsAny(st.Name, "/\\") {
			return Manifest{}, fmt.Errorf("%w: manifest of %s names stage %q in %q", ErrFormat, where, st.Name, st.Dir)
		}
	}
	for _, t := range m.Tasks {
		if t.File != filepath.Base(t.File) || t.File == "." || t.File == ".." || t.File == ManifestName || strings.Contains(t.File, "\\") {
			return Manifest{}, fmt.Errorf("%w: manifest of %s names data file %q outside the savepoint", ErrFormat, where, t.File)
		}
	}
	return m, nil
}
