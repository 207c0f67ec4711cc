package savepoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sluicehq/sluice/kstate"
)

// dataMagic and dataVersion open every data file's decompressed stream.
const (
	dataMagic   = "SLSP"
	dataVersion = 1
)

// DataFileName is the data file of the task of partition p.
func DataFileName(p int32) string { return fmt.Sprintf("task-%04d.data", p) }

// Cut is where a task's state was taken: its last committed epoch.
type Cut struct {
	Partition int32
	Epoch     uint64
	// Offsets maps each input topic to the next offset of the task's
	// partition to read, as the epoch's marker says.
	Offsets map[string]int64
	// Watermark is zero when the task has none.
	Watermark time.Time
}

// Source is a task's entries in ascending key order; a kstate.Backend is
// one (Scan with a nil prefix visits every entry).
type Source interface {
	Scan(prefix []byte, fn func(k, v []byte) error) error
}

// Writer writes one savepoint. Its methods must not run concurrently.
// Every Writer ends with Commit (the savepoint is complete) or Abort (its
// files are removed); either releases its storage client.
type Writer struct {
	st     store
	where  string
	m      Manifest
	states map[State]bool
	done   bool
}

// Create starts a savepoint at location: a local directory (a path or
// file://path; parents are created, the directory itself must not exist)
// or an object store's key prefix (s3://bucket/prefix?query or
// gs://bucket/prefix?query, which must hold no object yet), so a savepoint is never written over another. m's AppID, Job,
// Created, ChangelogTopic and Inputs are kept; its Format, States and Tasks
// are filled in by the Writer.
func Create(ctx context.Context, location string, m Manifest) (*Writer, error) {
	l, err := parseLocation(location)
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, l)
	if err != nil {
		return nil, err
	}
	if err := st.Prepare(ctx); err != nil {
		st.Close()
		return nil, err
	}
	m.Format, m.States, m.Tasks, m.Stages = FormatVersion, nil, nil, nil
	return &Writer{st: st, where: l.String(), m: m, states: map[State]bool{}}, nil
}

// SetJob sets the manifest's job name, for a writer that learns it from the
// tasks' epoch markers.
func (w *Writer) SetJob(name string) { w.m.Job = name }

// Location is where the savepoint is written, in the form Open reads: an
// absolute path or an s3:// or gs:// URL.
func (w *Writer) Location() string { return w.where }

// SetInputs sets the manifest's input topics, for a writer that learns them
// from the tasks it writes.
func (w *Writer) SetInputs(in []Input) { w.m.Inputs = in }

// SetStages makes the savepoint a pipeline's (FormatPipeline): stages are
// its later stages, whose savepoints the caller writes with writers of
// their own at Join(Location(), StageDir(name)) and commits before this
// one, so that the pipeline's manifest, written last, finds them whole.
func (w *Writer) SetStages(stages []string) {
	w.m.Stages = nil
	for _, name := range stages {
		w.m.Stages = append(w.m.Stages, Stage{Name: name, Dir: StageDir(name)})
	}
}

// WriteTask writes the data file of one task from src, which must yield the
// task's entries (keys as kstate encodes them) in ascending key order, and
// adds the task to the manifest. The file is streamed, its SHA-256 taken on
// the way, and durable before WriteTask returns (synced to disk, or its
// upload completed). Each partition may be written once.
func (w *Writer) WriteTask(ctx context.Context, cut Cut, src Source) (Task, error) {
	if w.done {
		return Task{}, errors.New("savepoint: WriteTask after Commit or Abort")
	}
	for _, t := range w.m.Tasks {
		if t.Partition == cut.Partition {
			return Task{}, fmt.Errorf("savepoint: task %d written twice", cut.Partition)
		}
	}
	t := Task{Partition: cut.Partition, Epoch: cut.Epoch, Offsets: cut.Offsets, File: DataFileName(cut.Partition)}
	if t.Offsets == nil {
		t.Offsets = map[string]int64{}
	}
	if !cut.Watermark.IsZero() {
		wm := cut.Watermark.UnixMilli()
		t.Watermark = &wm
	}
	f, err := w.st.Create(ctx, t.File)
	if err != nil {
		return Task{}, err
	}
	h := sha256.New()
	out := &counter{w: io.MultiWriter(f, h)}
	if err := writeEntries(ctx, out, src, &t, w.states); err != nil {
		f.Abort()
		return Task{}, fmt.Errorf("savepoint: task %d: %w", cut.Partition, err)
	}
	if err := f.Commit(); err != nil {
		return Task{}, fmt.Errorf("savepoint: task %d: %s: %w", cut.Partition, t.File, err)
	}
	t.Bytes, t.SHA256 = out.n, hex.EncodeToString(h.Sum(nil))
	w.m.Tasks = append(w.m.Tasks, t)
	return t, nil
}

// writeEntries writes the compressed stream: magic, version, then each
// entry as [uvarint len(key)][key][uvarint len(value)][value].
func writeEntries(ctx context.Context, out io.Writer, src Source, t *Task, states map[State]bool) error {
	// One goroutine and the default window: memory stays a few MiB
	// whatever the state's size.
	zw, err := zstd.NewWriter(out, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return err
	}
	defer zw.Close()
	if _, err := zw.Write(append([]byte(dataMagic), dataVersion)); err != nil {
		return err
	}
	var prev, buf []byte
	err = src.Scan(nil, func(k, v []byte) error {
		if t.Keys%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("source keys not ascending at %q", k)
		}
		key, err := kstate.DecodeKey(k)
		if err != nil {
			return err
		}
		states[State{Name: key.Name, Kind: key.Kind.String(), Codec: CodecUnknown}] = true
		buf = binary.AppendUvarint(buf[:0], uint64(len(k)))
		buf = append(buf, k...)
		buf = binary.AppendUvarint(buf, uint64(len(v)))
		buf = append(buf, v...)
		if _, err := zw.Write(buf); err != nil {
			return err
		}
		prev = append(prev[:0], k...)
		t.Keys++
		return nil
	})
	if err != nil {
		return err
	}
	return zw.Close()
}

// Commit writes the manifest, last: only now is the savepoint complete.
// Tasks are listed by partition, states by kind and name.
func (w *Writer) Commit(ctx context.Context) (Manifest, error) {
	if w.done {
		return Manifest{}, errors.New("savepoint: Commit after Commit or Abort")
	}
	w.done = true
	defer w.st.Close()
	sort.Slice(w.m.Tasks, func(i, j int) bool { return w.m.Tasks[i].Partition < w.m.Tasks[j].Partition })
	w.m.States = make([]State, 0, len(w.states))
	for s := range w.states {
		w.m.States = append(w.m.States, s)
	}
	slices.SortFunc(w.m.States, func(a, b State) int {
		if a.Kind != b.Kind {
			return strings.Compare(a.Kind, b.Kind)
		}
		return strings.Compare(a.Name, b.Name)
	})
	if w.m.Inputs == nil {
		w.m.Inputs = []Input{}
	}
	if w.m.Created.IsZero() {
		w.m.Created = time.Now().UTC()
	}
	w.m.Format = FormatVersion
	if len(w.m.Stages) > 0 {
		w.m.Format = FormatPipeline
	}
	if err := writeManifest(ctx, w.st, w.m); err != nil {
		return Manifest{}, err
	}
	return w.m, nil
}

// Abort removes every file of the savepoint written so far (the local
// directory, or every object under the prefix), so nothing is left that
// looks like one, and releases the Writer. It does nothing after Commit.
// Without it a dead writer's files stay behind, which Open refuses
// (ErrIncomplete) but does not remove.
func (w *Writer) Abort(ctx context.Context) error {
	if w.done {
		return nil
	}
	w.done = true
	defer w.st.Close()
	if err := w.st.RemoveAll(ctx); err != nil {
		return fmt.Errorf("savepoint: remove %s: %w", w.where, err)
	}
	return nil
}

// counter counts the bytes written through it: the data file's size.
type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
