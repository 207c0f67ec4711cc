package savepoint_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/objtest"
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

// stores are the kinds of location every test runs against: each returns
// a root under which the test writes its savepoints.
var stores = []struct {
	name string
	root func(t *testing.T) string
}{
	{"dir", func(t *testing.T) string { return t.TempDir() }},
	{"file URL", func(t *testing.T) string { return "file://" + t.TempDir() }},
	{"s3", s3Root},
	{"gcs", gcsRoot},
	{"azure", azureRoot},
}

// eachStore runs fn once per kind of location, with a fresh savepoint
// location (not yet written) under a fresh root.
func eachStore(t *testing.T, fn func(t *testing.T, loc string)) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			loc, err := savepoint.Join(st.root(t), "sp")
			if err != nil {
				t.Fatal(err)
			}
			fn(t, loc)
		})
	}
}

func readFile(t *testing.T, path string) func() []byte {
	return func() []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func writeFile(t *testing.T, path string) func([]byte) {
	return func(b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var ctx = context.Background()

func write(t *testing.T, dir string, tasks map[int32]kstate.Backend) savepoint.Manifest {
	t.Helper()
	w, err := savepoint.Create(ctx, dir, savepoint.Manifest{AppID: "app", ChangelogTopic: "app-changelog",
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
	if w.Location() != dir {
		t.Errorf("Location() = %q, want %q", w.Location(), dir)
	}
	m, err := w.Commit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func open(t *testing.T, loc string) *savepoint.Savepoint {
	t.Helper()
	sp, err := savepoint.Open(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

func scan(t *testing.T, sp *savepoint.Savepoint, task savepoint.Task) ([]entry, error) {
	t.Helper()
	var got []entry
	err := sp.Scan(ctx, task, func(k, v []byte) error {
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
	eachStore(t, func(t *testing.T, loc string) {
		write(t, loc, map[int32]kstate.Backend{0: big, 1: small, 2: empty})

		sp := open(t, loc)
		if sp.Location != loc {
			t.Errorf("Location %q, want %q", sp.Location, loc)
		}
		if err := sp.Verify(ctx); err != nil {
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
	})
}

func TestDamageIsDetected(t *testing.T) {
	be, _ := fill(t, 500)
	tests := []struct {
		name   string
		damage func(b []byte, m savepoint.Manifest) []byte
		want   error
	}{
		{"flipped byte", func(b []byte, _ savepoint.Manifest) []byte {
			b[len(b)/2] ^= 0x40
			return b
		}, savepoint.ErrChecksum},
		{"truncated", func(b []byte, m savepoint.Manifest) []byte {
			return b[:m.Tasks[0].Bytes-3]
		}, savepoint.ErrChecksum},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eachStore(t, func(t *testing.T, loc string) {
				m := write(t, loc, map[int32]kstate.Backend{0: be})
				get, put := object(t, loc, m.Tasks[0].File)
				put(tt.damage(get(), m))
				sp := open(t, loc)
				if err := sp.Verify(ctx); !errors.Is(err, tt.want) {
					t.Fatalf("Verify: %v, want %v", err, tt.want)
				}
				if _, err := scan(t, sp, sp.Manifest.Tasks[0]); !errors.Is(err, tt.want) {
					t.Fatalf("Scan: %v, want %v", err, tt.want)
				}
			})
		})
	}
}

// A location whose manifest was never written is not a savepoint.
func TestMissingManifestIsIncomplete(t *testing.T) {
	be, _ := fill(t, 10)
	eachStore(t, func(t *testing.T, loc string) {
		w, err := savepoint.Create(ctx, loc, savepoint.Manifest{AppID: "app"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteTask(ctx, savepoint.Cut{Partition: 0}, be); err != nil {
			t.Fatal(err)
		}
		if _, err := savepoint.Open(ctx, loc); !errors.Is(err, savepoint.ErrIncomplete) {
			t.Fatalf("Open before Commit: %v, want ErrIncomplete", err)
		}
		if _, err := w.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		open(t, loc)
		if objectStore(loc) {
			if got := fmt.Sprint(keys(t, loc)); got != "[backups/sp/manifest.json backups/sp/task-0000.data]" {
				t.Fatalf("objects %s", got)
			}
		} else if _, err := os.Stat(filepath.Join(loc, savepoint.ManifestName+".tmp")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("temporary manifest left behind: %v", err)
		}
		// Never over another savepoint.
		if _, err := savepoint.Create(ctx, loc, savepoint.Manifest{}); err == nil {
			t.Fatal("Create over an existing savepoint succeeded")
		}
	})
}

// Abort leaves nothing that looks like a savepoint, and nothing at all.
func TestAbortRemovesEverything(t *testing.T) {
	be, _ := fill(t, 10)
	eachStore(t, func(t *testing.T, loc string) {
		w, err := savepoint.Create(ctx, loc, savepoint.Manifest{AppID: "app"})
		if err != nil {
			t.Fatal(err)
		}
		for p := range int32(2) {
			if _, err := w.WriteTask(ctx, savepoint.Cut{Partition: p}, be); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Abort(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := savepoint.Open(ctx, loc); !errors.Is(err, savepoint.ErrIncomplete) {
			t.Fatalf("Open after Abort: %v, want ErrIncomplete", err)
		}
		if objectStore(loc) {
			if k := keys(t, loc); len(k) != 0 {
				t.Fatalf("left %v", k)
			}
		} else if _, err := os.Stat(loc); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("left the directory: %v", err)
		}
		// The location is free again.
		w, err = savepoint.Create(ctx, loc, savepoint.Manifest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestOtherFormatIsRefused(t *testing.T) {
	eachStore(t, func(t *testing.T, loc string) {
		w, err := savepoint.Create(ctx, loc, savepoint.Manifest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		_, put := object(t, loc, savepoint.ManifestName)
		for _, m := range []string{
			`{"format":3}`,
			`{"format":2}`, // a pipeline's without stages
			`{"format":1,"stages":[{"name":"count","dir":"stage-count"}]}`,
			`{"format":2,"stages":[{"name":"count","dir":"../elsewhere"}]}`,
			`{"format":2,"stages":[{"name":"a/b","dir":"stage-a/b"}]}`,
		} {
			put([]byte(m))
			if _, err := savepoint.Open(ctx, loc); !errors.Is(err, savepoint.ErrFormat) {
				t.Fatalf("Open of %s: %v, want ErrFormat", m, err)
			}
		}
	})
}

// A pipeline's savepoint: the first stage's with its later stages listed
// (FormatPipeline), each stage's a savepoint of its own under it, written
// first; Abort of the pipeline's removes the stages' too.
func TestPipelineSavepoint(t *testing.T) {
	small, _ := fill(t, 3)
	eachStore(t, func(t *testing.T, loc string) {
		w, err := savepoint.Create(ctx, loc, savepoint.Manifest{AppID: "app"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteTask(ctx, savepoint.Cut{Partition: 0}, small); err != nil {
			t.Fatal(err)
		}
		for _, stage := range []string{"a", "b"} {
			sloc, err := savepoint.Join(loc, savepoint.StageDir(stage))
			if err != nil {
				t.Fatal(err)
			}
			write(t, sloc, map[int32]kstate.Backend{0: small})
		}
		w.SetStages([]string{"a", "b"})
		m, err := w.Commit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sp := open(t, loc)
		if sp.Manifest.Format != savepoint.FormatPipeline || !reflect.DeepEqual(sp.Manifest.Stages, m.Stages) ||
			!reflect.DeepEqual(m.Stages, []savepoint.Stage{{Name: "a", Dir: "stage-a"}, {Name: "b", Dir: "stage-b"}}) {
			t.Fatalf("manifest: %+v", sp.Manifest)
		}
		for _, st := range sp.Manifest.Stages {
			sloc, _ := savepoint.Join(loc, st.Dir)
			if s := open(t, sloc); s.Manifest.Format != savepoint.FormatVersion || len(s.Manifest.Tasks) != 1 || s.Verify(ctx) != nil {
				t.Fatalf("stage %s: %+v", st.Name, s.Manifest)
			}
		}
	})
	dir := filepath.Join(t.TempDir(), "sp")
	w, err := savepoint.Create(ctx, dir, savepoint.Manifest{AppID: "app"})
	if err != nil {
		t.Fatal(err)
	}
	sloc, _ := savepoint.Join(dir, savepoint.StageDir("a"))
	write(t, sloc, map[int32]kstate.Backend{0: small})
	if err := w.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("after Abort: %v", err)
	}
}

func TestLocations(t *testing.T) {
	abs, err := filepath.Abs("rel")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		base, want string
		bad        bool
	}{
		{base: "/backups", want: "/backups/app-1"},
		{base: "rel", want: filepath.Join(abs, "app-1")},
		{base: "file:///backups/", want: "/backups/app-1"},
		{base: "file://rel", want: filepath.Join(abs, "app-1")},
		{base: "s3://bucket", want: "s3://bucket/app-1"},
		{base: "s3://bucket/a/b/?region=eu-west-1&endpoint=http://127.0.0.1:9000", want: "s3://bucket/a/b/app-1?region=eu-west-1&endpoint=http://127.0.0.1:9000"},
		{base: "", bad: true},
		{base: "file://", bad: true},
		{base: "s3:///prefix", bad: true},
		{base: "gs://bucket/prefix", want: "gs://bucket/prefix/app-1"},
		{base: "gs://bucket/?anonymous=true", want: "gs://bucket/app-1?anonymous=true"},
		{base: "gs:///prefix", bad: true},
		{base: "azblob://container/p?localemu=true", want: "azblob://container/p/app-1?localemu=true"},
		{base: "azblob:///prefix", bad: true},
		{base: "abs://c/p", bad: true},
	}
	for _, tt := range tests {
		got, err := savepoint.Join(tt.base, "app-1")
		if tt.bad {
			if !errors.Is(err, savepoint.ErrLocation) {
				t.Errorf("Join(%q) = %q, %v; want ErrLocation", tt.base, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Join(%q) = %q, %v; want %q", tt.base, got, err, tt.want)
		}
	}
	// Query parameters s3blob does not know are refused before any I/O.
	if err := savepoint.CheckLocation(ctx, "s3://bucket/p?no_such_parameter=1"); !errors.Is(err, savepoint.ErrLocation) {
		t.Errorf("CheckLocation with an unknown parameter: %v", err)
	}
	if err := savepoint.CheckLocation(ctx, "s3://bucket/p?region=us-east-1"); err != nil {
		t.Errorf("CheckLocation: %v", err)
	}
}

// A gs:// location is checked as an s3:// one is: its query parameters,
// and its credentials, before any object is read or written.
func TestGCSLocationChecks(t *testing.T) {
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
	for _, tt := range []struct {
		loc, want string // want: "" for accepted, else a part of the error
	}{
		{"gs://bucket/p?anonymous=true", ""},
		{"gs://bucket/p?access_id=-", ""},
		{"gs://bucket/p?no_such_parameter=1", `invalid query parameter "no_such_parameter"`},
		{"gs://bucket/p?anonymous=maybe", `parsing "maybe"`},
		{"gs://bucket/p?grpc=true", "not supported here"},
		{"gs://bucket/p", "no Google Cloud credentials"},
	} {
		err := savepoint.CheckLocation(ctx, tt.loc)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckLocation(%q): %v", tt.loc, err)
		case tt.want != "" && (!errors.Is(err, savepoint.ErrLocation) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckLocation(%q): %v, want ErrLocation saying %q", tt.loc, err, tt.want)
		}
	}
	// With an emulator, no credentials are needed; its address has no
	// scheme (gcsblob adds one).
	t.Setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:1")
	if err := savepoint.CheckLocation(ctx, "gs://bucket/p"); err != nil {
		t.Errorf("CheckLocation with STORAGE_EMULATOR_HOST: %v", err)
	}
	t.Setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
	if err := savepoint.CheckLocation(ctx, "gs://bucket/p"); !errors.Is(err, savepoint.ErrLocation) || !strings.Contains(err.Error(), "without a scheme") {
		t.Errorf("CheckLocation with a scheme in STORAGE_EMULATOR_HOST: %v", err)
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
	eachStore(t, func(t *testing.T, loc string) {
		w, err := savepoint.Create(ctx, loc, savepoint.Manifest{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Abort(ctx)
		if _, err := w.WriteTask(ctx, savepoint.Cut{}, unsorted{}); err == nil {
			t.Fatal("WriteTask accepted keys out of order")
		}
	})
}

// A task whose data file is past the AWS SDK's multipart threshold (16
// MiB) goes to S3 in several 8 MiB parts, and to Google Cloud Storage in
// several 8 MiB chunks of a resumable upload; it reads back whole.
func TestLargeTask(t *testing.T) {
	be := kstate.NewMemory()
	defer be.Close()
	rng := rand.NewChaCha8([32]byte{1})
	var muts []kstate.Mutation
	for i := range 1100 {
		v := make([]byte, 16<<10) // random: zstd cannot shrink it
		rng.Read(v)
		muts = append(muts, kstate.Mutation{Key: kstate.EncodeKey(kstate.KindKeyed, "blob", fmt.Appendf(nil, "k%04d", i), nil), Value: v})
	}
	if err := be.Apply(muts, kstate.Meta{}); err != nil {
		t.Fatal(err)
	}
	// Object stores alone: a local file is written the same whatever its
	// size.
	for _, st := range []struct {
		name  string
		start func(testing.TB) (string, *atomic.Int64)
	}{{"s3", objtest.S3}, {"gcs", objtest.GCS}, {"azure", objtest.Azure}} {
		t.Run(st.name, func(t *testing.T) {
			root, parts := st.start(t)
			loc, err := savepoint.Join(root, "sp")
			if err != nil {
				t.Fatal(err)
			}
			m := write(t, loc, map[int32]kstate.Backend{0: be})
			if m.Tasks[0].Bytes < 17<<20 {
				t.Fatalf("data file is %d bytes, want more than 16 MiB", m.Tasks[0].Bytes)
			}
			if n := parts.Load(); n < 3 {
				t.Fatalf("%d parts (blocks) uploaded, want the %d-byte file in parts of 8 MiB or less", n, m.Tasks[0].Bytes)
			}
			sp := open(t, loc)
			if err := sp.Verify(ctx); err != nil {
				t.Fatal(err)
			}
			got, err := scan(t, sp, sp.Manifest.Tasks[0])
			if err != nil || len(got) != 1100 {
				t.Fatalf("scan: %d entries, %v", len(got), err)
			}
		})
	}
}
