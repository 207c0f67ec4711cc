package savepoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/savepoint"
)

type entry struct{ k, v []byte }

// fill returns a memory backend holding n keyed entries of "count", one
// operator entry and one timer, and the entries in key order.
func fill(t *testing.T, n int) (kstate.Backend, []entry) {
	t.Helper()
	be := kstate.NewMemory()
	var muts []kstate.Mutation
	for i := range n {
		muts = append(muts, kstate.Mutation{
			Key:   kstate.EncodeKey(kstate.KindKeyed, "count", fmt.Appendf(nil, "key-%05d", i), nil),
			Value: fmt.Appendf(nil, "%d", i*7),
		})
	}
	muts = append(muts,
		kstate.Mutation{Key: kstate.EncodeKey(kstate.KindOperator, "offsets", nil, nil), Value: []byte{}},
		kstate.Mutation{Key: kstate.EncodeKey(kstate.KindTimer, "", []byte("key-1"), []byte{0, 1}), Value: []byte("t")},
	)
	if err := be.Apply(muts, kstate.Meta{}); err != nil {
		t.Fatal(err)
	}
	var want []entry
	be.Scan(nil, func(k, v []byte) error {
		want = append(want, entry{bytes.Clone(k), bytes.Clone(v)})
		return nil
	})
	t.Cleanup(func() { be.Close() })
	return be, want
}

func write(t *testing.T, dir string, tasks map[int32]kstate.Backend) savepoint.Manifest {
	t.Helper()
	w, err := savepoint.Create(dir, savepoint.Manifest{AppID: "app", ChangelogTopic: "app-changelog",
		Inputs: []savepoint.Input{{Topic: "in", Partitions: int32(len(tasks))}}})
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(len(tasks)) - 1; p >= 0; p-- {
		cut := savepoint.Cut{Partition: p, Epoch: uint64(10 + p), Offsets: map[string]int64{"in": int64(100 * p)}}
		if p == 0 {
			cut.Watermark = time.UnixMilli(1234)
		}
		if _, err := w.WriteTask(context.Background(), cut, tasks[p]); err != nil {
			t.Fatal(err)
		}
	}
	m, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func scan(t *testing.T, sp *savepoint.Savepoint, task savepoint.Task) ([]entry, error) {
	t.Helper()
	var got []entry
	err := sp.Scan(task, func(k, v []byte) error {
		got = append(got, entry{bytes.Clone(k), bytes.Clone(v)})
		return nil
	})
	return got, err
}

func TestRoundTrip(t *testing.T) {
	big, bigWant := fill(t, 20000)
	small, smallWant := fill(t, 3)
	empty := kstate.NewMemory()
	defer empty.Close()
	dir := filepath.Join(t.TempDir(), "sp")
	write(t, dir, map[int32]kstate.Backend{0: big, 1: small, 2: empty})

	sp, err := savepoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Verify(); err != nil {
		t.Fatal(err)
	}
	m := sp.Manifest
	if m.Format != savepoint.FormatVersion || m.AppID != "app" || m.Job != "" || m.Created.IsZero() || len(m.Tasks) != 3 {
		t.Fatalf("manifest: %+v", m)
	}
	wantStates := []savepoint.State{{Name: "count", Kind: "keyed", Codec: "unknown"}, {Name: "offsets", Kind: "operator", Codec: "unknown"}, {Name: "", Kind: "timer", Codec: "unknown"}}
	if fmt.Sprint(m.States) != fmt.Sprint(wantStates) {
		t.Fatalf("states %+v, want %+v", m.States, wantStates)
	}
	for p, want := range [][]entry{bigWant, smallWant, nil} {
		task := m.Tasks[p]
		if task.Partition != int32(p) || task.Epoch != uint64(10+p) || task.Offsets["in"] != int64(100*p) ||
			task.File != fmt.Sprintf("task-%04d.data", p) || task.Keys != int64(len(want)) {
			t.Fatalf("task %d: %+v", p, task)
		}
		if (p == 0) != (task.Watermark != nil) || (p == 0 && !task.WatermarkTime().Equal(time.UnixMilli(1234))) {
			t.Fatalf("task %d watermark: %v", p, task.Watermark)
		}
		got, err := scan(t, sp, task)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("task %d: %d entries, want %d", p, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i].k, want[i].k) || !bytes.Equal(got[i].v, want[i].v) {
				t.Fatalf("task %d entry %d: %q=%q, want %q=%q", p, i, got[i].k, got[i].v, want[i].k, want[i].v)
			}
		}
	}
	// Compressed: 20,000 entries of about 20 bytes take far less.
	if m.Tasks[0].Bytes > 200000 {
		t.Errorf("task 0 data file is %d bytes", m.Tasks[0].Bytes)
	}
}

func TestDamageIsDetected(t *testing.T) {
	be, _ := fill(t, 500)
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string, m savepoint.Manifest)
		want   error
	}{
		{"flipped byte", func(t *testing.T, dir string, m savepoint.Manifest) {
			path := filepath.Join(dir, m.Tasks[0].File)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 0x40
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, savepoint.ErrChecksum},
		{"truncated", func(t *testing.T, dir string, m savepoint.Manifest) {
			if err := os.Truncate(filepath.Join(dir, m.Tasks[0].File), m.Tasks[0].Bytes-3); err != nil {
				t.Fatal(err)
			}
		}, savepoint.ErrChecksum},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "sp")
			m := write(t, dir, map[int32]kstate.Backend{0: be})
			tt.damage(t, dir, m)
			sp, err := savepoint.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := sp.Verify(); !errors.Is(err, tt.want) {
				t.Fatalf("Verify: %v, want %v", err, tt.want)
			}
			if _, err := scan(t, sp, sp.Manifest.Tasks[0]); !errors.Is(err, tt.want) {
				t.Fatalf("Scan: %v, want %v", err, tt.want)
			}
		})
	}
}

// A directory whose manifest was never written is not a savepoint.
func TestMissingManifestIsIncomplete(t *testing.T) {
	be, _ := fill(t, 10)
	dir := filepath.Join(t.TempDir(), "sp")
	w, err := savepoint.Create(dir, savepoint.Manifest{AppID: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTask(context.Background(), savepoint.Cut{Partition: 0}, be); err != nil {
		t.Fatal(err)
	}
	if _, err := savepoint.Open(dir); !errors.Is(err, savepoint.ErrIncomplete) {
		t.Fatalf("Open before Commit: %v, want ErrIncomplete", err)
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := savepoint.Open(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, savepoint.ManifestName+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary manifest left behind: %v", err)
	}
	// Never over another savepoint.
	if _, err := savepoint.Create(dir, savepoint.Manifest{}); err == nil {
		t.Fatal("Create over an existing savepoint succeeded")
	}
}

func TestOtherFormatIsRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, savepoint.ManifestName), []byte(`{"format":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := savepoint.Open(dir); !errors.Is(err, savepoint.ErrFormat) {
		t.Fatalf("Open: %v, want ErrFormat", err)
	}
}

type unsorted struct{}

func (unsorted) Scan(_ []byte, fn func(k, v []byte) error) error {
	for _, k := range []string{"b", "a"} {
		if err := fn(kstate.EncodeKey(kstate.KindKeyed, "s", []byte(k), nil), []byte("v")); err != nil {
			return err
		}
	}
	return nil
}

func TestUnsortedSourceIsRefused(t *testing.T) {
	w, err := savepoint.Create(filepath.Join(t.TempDir(), "sp"), savepoint.Manifest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteTask(context.Background(), savepoint.Cut{}, unsorted{}); err == nil {
		t.Fatal("WriteTask accepted keys out of order")
	}
}
