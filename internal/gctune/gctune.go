// Package gctune sets the Go collector of the processor binary (cmd/processor)
// for a stream processor's allocation pattern, unless the environment sets it.
//
// A processor allocates a few hundred bytes per record (the records
// themselves) against a live heap that, with the bbolt backend, stays small
// and does not grow with state. With Go's default GOGC=100 the collector then
// runs every few megabytes allocated, dozens of times a second at full
// speed, and is 15–20 % of the CPU. With the bbolt backend the binary
// therefore defaults to GOGC=200 (BENCHMARKS.md, "Settings chosen by
// measurement": most of GOGC=400's gain at half its extra memory), which
// lets the heap grow to three times a small live heap instead of two. The
// memory backend's live heap is its state, so it keeps Go's default.
//
// Wherever the process runs under a cgroup memory limit (a container with a
// limit), GOMEMLIMIT is set to 90 % of it by automemlimit, so that the
// collector works harder near the limit instead of the process being killed
// at it, whatever GOGC is.
//
// GOGC, GOMEMLIMIT and AUTOMEMLIMIT (automemlimit's ratio, or "off") in the
// environment take precedence; an empty one counts as unset, as for Go. The
// library (package sluice) changes none of this: its host owns the
// collector.
package gctune

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// BboltGOGC is the processor binary's GOGC with the bbolt backend.
const BboltGOGC = 200

// Setting is what Apply left the collector with.
type Setting struct {
	GOGC       int    // the GC percent in effect
	GOGCFrom   string // "environment", "default for bbolt" or "Go default"
	MemLimit   int64  // bytes; math.MaxInt64 is no limit
	LimitFrom  string // "environment", "cgroup" or "none"
	LimitError error  // the cgroup could not be read (the limit is left alone)
}

// LogAttrs describes s for the start-up log line (slog key-value pairs).
func (s Setting) LogAttrs() []any {
	limit := "none"
	if s.MemLimit != math.MaxInt64 {
		limit = fmt.Sprintf("%d MiB", s.MemLimit>>20)
	}
	attrs := []any{"gogc", s.GOGC, "gogc_from", s.GOGCFrom, "gomemlimit", limit, "gomemlimit_from", s.LimitFrom}
	if s.LimitError != nil {
		attrs = append(attrs, "gomemlimit_err", s.LimitError.Error())
	}
	return attrs
}

// Apply sets the collector for a processor whose state backend is backend
// ("bbolt" or "memory"). Its error, a configuration error, names
// AUTOMEMLIMIT when that variable is malformed; a cgroup that cannot be read
// is not an error but Setting.LimitError, and leaves the limit alone.
func Apply(backend string) (Setting, error) {
	var s Setting
	switch {
	case os.Getenv("GOGC") != "": // Go ignores an empty one too
		s.GOGCFrom = "environment"
		s.GOGC = readGOGC()
	case backend == "bbolt":
		s.GOGCFrom = "default for bbolt"
		s.GOGC = BboltGOGC
		debug.SetGCPercent(BboltGOGC)
	default:
		s.GOGCFrom = "Go default"
		s.GOGC = 100
	}
	switch v, set := os.LookupEnv("AUTOMEMLIMIT"); {
	case os.Getenv("GOMEMLIMIT") != "":
		s.LimitFrom = "environment" // automemlimit ignores AUTOMEMLIMIT then, and so do we
	case v == "off":
		s.LimitFrom = "none"
	case set:
		if r, err := strconv.ParseFloat(v, 64); err != nil || !(r > 0 && r <= 1) {
			return s, fmt.Errorf("AUTOMEMLIMIT: want a ratio in (0,1] or off, got %q", v)
		}
		fallthrough
	default:
		s.LimitFrom = "cgroup"
	}
	limit, err := memlimit.Set(memlimit.WithProvider(memlimit.FromCgroup))
	s.MemLimit = debug.SetMemoryLimit(-1) // a negative limit only reads it
	if err != nil {
		s.LimitError = err
	}
	if s.LimitFrom == "cgroup" && limit == math.MaxInt64 {
		s.LimitFrom = "none"
	}
	return s, nil
}

// readGOGC reads the GC percent in effect without changing it (-1: off).
func readGOGC() int {
	sample := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		return 100
	}
	if v := sample[0].Value.Uint64(); v != math.MaxUint64 {
		return int(v)
	}
	return -1
}
