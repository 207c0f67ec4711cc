package gctune

import (
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

// restore puts the test binary's collector back as it was.
func restore(t *testing.T) {
	percent := debug.SetGCPercent(100)
	debug.SetGCPercent(percent)
	limit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	})
}

func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestApplyDefaults(t *testing.T) {
	tests := []struct {
		name, backend, gogc string
		wantPercent         int
		wantFrom            string
	}{
		{"bbolt raises GOGC", "bbolt", "", BboltGOGC, "default for bbolt"},
		{"memory keeps Go's default", "memory", "", 100, "Go default"},
		{"GOGC in the environment wins", "bbolt", "150", 150, "environment"},
		{"an empty GOGC is unset, as for Go", "bbolt", "empty", BboltGOGC, "default for bbolt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			restore(t)
			t.Setenv("AUTOMEMLIMIT", "off") // the machine's cgroup is not the test's business
			unsetenv(t, "GOMEMLIMIT")       // nor is CI's environment
			debug.SetMemoryLimit(math.MaxInt64)
			switch tt.gogc {
			case "empty":
				t.Setenv("GOGC", "")
				debug.SetGCPercent(100)
			case "":
				unsetenv(t, "GOGC")
				debug.SetGCPercent(100)
			default:
				t.Setenv("GOGC", tt.gogc)
				// The runtime read GOGC when the process started; a
				// process started with it would be at its value.
				debug.SetGCPercent(150)
			}
			s, err := Apply(tt.backend)
			if err != nil {
				t.Fatal(err)
			}
			if s.GOGC != tt.wantPercent || s.GOGCFrom != tt.wantFrom || gcPercent() != tt.wantPercent {
				t.Fatalf("Apply(%s) = %+v, GC percent %d; want %d from %q", tt.backend, s, gcPercent(), tt.wantPercent, tt.wantFrom)
			}
			if s.LimitFrom != "none" || s.MemLimit != math.MaxInt64 {
				t.Fatalf("AUTOMEMLIMIT=off: limit %d from %q, want none", s.MemLimit, s.LimitFrom)
			}
		})
	}
}

func TestApplyKeepsAGivenMemoryLimit(t *testing.T) {
	restore(t)
	// GOMEMLIMIT wins, and AUTOMEMLIMIT, unused, is not checked.
	t.Setenv("AUTOMEMLIMIT", "ninety")
	t.Setenv("GOMEMLIMIT", "512MiB")
	debug.SetMemoryLimit(512 << 20) // as the runtime would have at start
	s, err := Apply("bbolt")
	if err != nil {
		t.Fatal(err)
	}
	if s.LimitFrom != "environment" || s.MemLimit != 512<<20 || debug.SetMemoryLimit(-1) != 512<<20 {
		t.Fatalf("GOMEMLIMIT=512MiB: %+v, runtime limit %d", s, debug.SetMemoryLimit(-1))
	}
}

func TestApplyRefusesABadRatio(t *testing.T) {
	for _, v := range []string{"1.5", "0", "-0.2", "ninety", ""} {
		restore(t)
		t.Setenv("AUTOMEMLIMIT", v)
		unsetenv(t, "GOMEMLIMIT")
		_, err := Apply("bbolt")
		if err == nil || !strings.HasPrefix(err.Error(), "AUTOMEMLIMIT: ") {
			t.Fatalf("AUTOMEMLIMIT=%q: err %v, want one naming AUTOMEMLIMIT", v, err)
		}
	}
}

func TestLogAttrsNameTheLimit(t *testing.T) {
	s := Setting{GOGC: 200, GOGCFrom: "default for bbolt", MemLimit: 900 << 20, LimitFrom: "cgroup"}
	got := s.LogAttrs()
	want := []any{"gogc", 200, "gogc_from", "default for bbolt", "gomemlimit", "900 MiB", "gomemlimit_from", "cgroup"}
	if len(got) != len(want) {
		t.Fatalf("LogAttrs = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("LogAttrs = %v, want %v", got, want)
		}
	}
}

// unsetenv removes name for the test, restoring it after.
func unsetenv(t *testing.T, name string) {
	t.Setenv(name, "") // registers the restore
	if err := os.Unsetenv(name); err != nil {
		t.Fatal(err)
	}
}
