package sluice

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/kstate/kstatetest"
)

// A store a restore from scratch left in the merge of its runs (Partial at
// offset 0: not a log prefix) is not resumed but restored from scratch
// again; a partial log prefix is resumed as before.
func TestStaleInterruptedRestoreFromScratch(t *testing.T) {
	in := &Instance{}
	in.changelogInfo.DeleteRetention = 24 * time.Hour
	now := time.Now()
	if why := in.stale(kstate.Meta{Partial: true, AppliedAt: now}); why == "" {
		t.Fatal("a partial store at offset 0 was resumed")
	}
	if why := in.stale(kstate.Meta{Partial: true, ChangelogOffset: 500, AppliedAt: now}); why != "" {
		t.Fatalf("a partial log prefix was not resumed: %s", why)
	}
	if why := in.stale(kstate.Meta{}); why != "" {
		t.Fatalf("an empty store is stale: %s", why)
	}
}

// A restore sorts into an empty bbolt store or a partial one, not into a
// whole one or the memory backend; the runs an earlier restore of the task
// left are deleted whatever it decides, and at start every task's are.
func TestRestoreRunsDir(t *testing.T) {
	dir := t.TempDir()
	in := &Instance{cfg: Options{Backend: "bbolt", StateDir: dir, AppID: "app"}}
	leftover := func(p int32) string {
		t.Helper()
		d := in.restoreRunsPath(p)
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "run-000000"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		return d
	}
	gone := func(d string) bool {
		_, err := os.Stat(d)
		return os.IsNotExist(err)
	}
	empty := kstatetest.MustOpen(t, kstate.BoltBackend)
	full := kstatetest.MustOpen(t, kstate.BoltBackend)
	if err := full.Apply([]kstate.Mutation{{Key: []byte("k"), Value: []byte("v")}}, kstate.Meta{ChangelogOffset: 9}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		be   kstate.Backend
		meta kstate.Meta
		sort bool
	}{
		{"empty", empty, kstate.Meta{}, true},
		{"whole", full, kstate.Meta{ChangelogOffset: 9}, false},
		{"partial", full, kstate.Meta{ChangelogOffset: 9, Partial: true}, true},
	} {
		d := leftover(3)
		got, err := in.restoreRunsDir(3, tc.be, tc.meta)
		if err != nil {
			t.Fatal(err)
		}
		if (got != "") != tc.sort || tc.sort && got != d {
			t.Fatalf("%s: runs dir %q, want sorting %v in %s", tc.name, got, tc.sort, d)
		}
		if !gone(d) {
			t.Fatalf("%s: the earlier restore's runs are still there", tc.name)
		}
	}
	mem := &Instance{cfg: Options{Backend: "memory", StateDir: dir, AppID: "app"}}
	if got, err := mem.restoreRunsDir(3, kstate.NewMemory(), kstate.Meta{}); err != nil || got != "" {
		t.Fatalf("memory backend: runs dir %q, %v", got, err)
	}

	a, b := leftover(1), leftover(2)
	task := filepath.Join(in.stateDir(), "task-0001.db")
	if err := os.WriteFile(task, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	in.removeRestoreRuns()
	if !gone(a) || !gone(b) || gone(task) {
		t.Fatalf("at start: runs gone %v %v, task file gone %v", gone(a), gone(b), gone(task))
	}
}
