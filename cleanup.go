package sluice

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// State files of tasks this instance does not own are deleted once they
// have been left alone for Options.StateCleanupDelay (Kafka Streams'
// state.cleanup.delay.ms). A partition that comes back soon after a
// rebalance restores from its file and reads only the changelog tail; one
// that stays away has its file removed, so no stale file lingers to be
// trusted much later. A bbolt file's modification time is its last apply,
// which makes the rule hold across restarts with no bookkeeping of its own.

// sweepStateFiles deletes the unowned, old state files, at most once per
// half delay (and at least every 30s).
func (l *loop) sweepStateFiles() {
	in := l.in
	// Only once the group has told us what we own: right after a start,
	// every file looks unowned.
	if in.cfg.Backend != "bbolt" || !in.Ready() {
		return
	}
	now := in.now()
	if now.Sub(l.sweptAt) < min(in.cfg.StateCleanupDelay/2, 30*time.Second) {
		return
	}
	l.sweptAt = now
	dir := in.stateDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return // no state yet
	}
	for _, e := range entries {
		p, ok := taskOfFile(e.Name())
		if !ok || l.tasks[p] != nil || l.restoring[p] != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil || now.Sub(fi.ModTime()) < in.cfg.StateCleanupDelay {
			continue
		}
		path := filepath.Join(dir, e.Name())
		// A standby's file is not a released task's.
		removed, err := in.standbys.removeUnlessHeld(p, func() error { return os.Remove(path) })
		if err != nil {
			in.log.Warn("deleting the state file of a released task failed", "file", path, "err", err)
			continue
		}
		if !removed {
			continue
		}
		in.log.Info("deleted the state file of a task released long ago", "task", p, "file", path, "idle", now.Sub(fi.ModTime()).Round(time.Second).String())
	}
}

// taskOfFile parses "task-NNNN.db".
func taskOfFile(name string) (int32, bool) {
	s, ok := strings.CutPrefix(name, "task-")
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, ".db"); !ok {
		return 0, false
	}
	p, err := strconv.ParseInt(s, 10, 32)
	return int32(p), err == nil && p >= 0
}
