package sluice

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/kstate"
)

// restore opens task p's store and brings it up to date from its changelog
// partition. A store that cannot be trusted is not used: a corrupt file is
// moved aside, a stale one (see stale) or one the changelog has moved past
// is deleted, and the task is restored from the start of its changelog.
func (in *Instance) restore(ctx context.Context, p int32) restoreResult {
	start := time.Now()
	// The file is the task's now: a standby of it here stops first.
	in.standbys.acquire(p)
	// Before anything of the changelog is read (sink.go).
	claim, err := in.sinkClaim(ctx, p)
	if err != nil {
		return restoreResult{p: p, err: err}
	}
	fresh := false
	for {
		be, meta, err := in.openStore(p, fresh)
		if err != nil {
			return restoreResult{p: p, err: err}
		}
		res, err := in.restoreSeeded(ctx, p, be, meta)
		if err == nil {
			meta, err = be.Meta()
		}
		switch {
		case err == nil && !meta.Partial:
			if err := in.sinkRecover(ctx, claim, meta); err != nil {
				be.Close()
				return restoreResult{p: p, err: err}
			}
			in.log.Info("task restored", "task", p, "records", res.Records, "epoch", meta.Epoch,
				"offsets", meta.Offsets, "orphans", len(res.Orphans), "took", time.Since(start).Round(time.Millisecond).String())
			return restoreResult{p: p, be: be, meta: meta, orphans: res.Orphans}
		case err == nil:
			err = errors.New("a partial restore found no marker to complete it")
		}
		be.Close()
		if fresh || ctx.Err() != nil || !(errors.Is(err, changelog.ErrStateBehind) || meta.Partial) {
			return restoreResult{p: p, err: fmt.Errorf("restore task %d: %w", p, err)}
		}
		in.log.Warn("local state cannot be completed from the changelog; restoring the task from scratch", "task", p, "err", err)
		fresh = true
	}
}

// restoreSeeded is restoreStore for an app that seeds new tasks from a
// savepoint (seed.go): a task whose changelog turns out to hold no marker is
// seeded, then restored from what the seeding wrote.
func (in *Instance) restoreSeeded(ctx context.Context, p int32, be kstate.Backend, meta kstate.Meta) (changelog.Result, error) {
	if in.seed == nil || len(meta.Offsets) > 0 || meta.Partial {
		return in.restoreStore(ctx, p, be, meta)
	}
	// Ordering rule: the producer that seeds is initialised, fencing
	// every earlier seeder, before the changelog is read.
	cl, err := in.seedClient(ctx, p)
	if err != nil {
		return changelog.Result{}, err
	}
	defer cl.Close()
	res, err := in.restoreStore(ctx, p, be, meta)
	if err != nil || res.Last != nil {
		return res, err
	}
	if err := in.seedTask(ctx, cl, p, res.Orphans); err != nil {
		return res, err
	}
	return in.restoreStore(ctx, p, be, meta)
}

// stateDir holds the app's task files: task-NNNN.db (see taskOfFile).
func (in *Instance) stateDir() string { return filepath.Join(in.cfg.StateDir, in.cfg.AppID) }

func taskName(p int32) string { return fmt.Sprintf("task-%04d", p) }

// openStore opens task p's backend and reads its meta. With fresh, or when
// the file is corrupt or stale, the task starts from an empty store.
func (in *Instance) openStore(p int32, fresh bool) (kstate.Backend, kstate.Meta, error) {
	dir, name := in.stateDir(), taskName(p)
	if fresh {
		in.standbys.forget(p) // the group is told of copies, not of empty files
		if err := kstate.Remove(in.cfg.Backend, dir, name); err != nil {
			return nil, kstate.Meta{}, err
		}
	}
	be, err := in.cfg.OpenBackend(in.cfg.Backend, dir, name)
	var meta kstate.Meta
	if err == nil {
		if meta, err = be.Meta(); err != nil {
			be.Close()
		}
	}
	if errors.Is(err, kstate.ErrCorrupt) {
		// The changelog holds everything the file did: keep the file
		// for a post-mortem, start over without it.
		aside := kstate.BoltPath(dir, name) + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
		in.log.Warn("state file is corrupt; moved aside, restoring the task from the changelog", "task", p, "file", aside, "err", err)
		if rerr := os.Rename(kstate.BoltPath(dir, name), aside); rerr != nil {
			return nil, kstate.Meta{}, fmt.Errorf("move corrupt state of task %d aside: %w", p, rerr)
		}
		in.standbys.forget(p)
		return in.openStore(p, false)
	}
	if err != nil {
		return nil, kstate.Meta{}, fmt.Errorf("open store of task %d: %w", p, err)
	}
	if why := in.stale(meta); why != "" {
		be.Close()
		in.log.Warn("local state is stale; restoring the task from the changelog", "task", p, "why", why)
		return in.openStore(p, true)
	}
	return be, meta, nil
}

// stale says why a store's meta cannot be trusted to resume from, or "".
// Compaction drops a tombstone delete.retention.ms after it cleaned it; a
// store last brought up to date longer ago than that may have missed a
// delete for good, and would bring the key back.
func (in *Instance) stale(meta kstate.Meta) string {
	if meta.Partial && meta.ChangelogOffset <= 0 {
		// A restore from scratch stopped in the merge of its runs: its
		// keys are not a log prefix, so a tombstone compacted away since
		// could not delete one; and sorting again is faster anyway.
		return "a restore from scratch was interrupted"
	}
	if meta.ChangelogOffset <= 0 && len(meta.Offsets) == 0 {
		return "" // empty: nothing to resume from anyway
	}
	if meta.AppliedAt.IsZero() {
		return "the store does not say when it was last applied (written by an older release)"
	}
	// Half the retention: compaction may clean a tombstone well after it
	// was written, but nothing says how long after; and clocks drift.
	limit := in.changelogInfo.DeleteRetention / 2
	if age := in.now().Sub(meta.AppliedAt); age > limit {
		return fmt.Sprintf("last applied %s ago, beyond half the changelog's delete.retention.ms (%s)", age.Round(time.Second), in.changelogInfo.DeleteRetention)
	}
	return ""
}

// admitRestore waits until fewer than Options.RestoreConcurrency restores
// read more than a batch of their changelog, and takes a place among them
// (changelog.RestoreParams.Admit). A restore cancelled while it waits (its
// task given away, the instance stopping) does not read.
func (in *Instance) admitRestore(ctx context.Context, p int32, records int64) (func(), error) {
	select {
	case in.restoreSlots <- struct{}{}:
	default:
		in.log.Info("restore waits for its turn", "task", p, "records", records, "restore_concurrency", cap(in.restoreSlots))
		select {
		case in.restoreSlots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	in.log.Info("restoring task", "task", p, "records", records)
	return func() {
		in.log.Debug("restore read its changelog; its turn ends", "task", p)
		<-in.restoreSlots
	}, nil
}

// restoreStore reads the changelog into be from the offset its meta holds.
func (in *Instance) restoreStore(ctx context.Context, p int32, be kstate.Backend, meta kstate.Meta) (changelog.Result, error) {
	return in.readChangelog(ctx, p, be, meta, nil)
}

// readChangelog brings be up to date from task p's changelog partition,
// from the offset its meta holds. adapt, if set, changes the read's
// parameters: a standby's round (standby.go) reads live.
func (in *Instance) readChangelog(ctx context.Context, p int32, be kstate.Backend, meta kstate.Meta, adapt func(*changelog.RestoreParams)) (changelog.Result, error) {
	var applied *changelog.Marker
	if wholeCopy(meta) {
		applied = &changelog.Marker{Epoch: meta.Epoch, Offsets: meta.Offsets, Watermark: meta.Watermark}
	}
	label := taskLabel(p)
	defer in.m.restoreRemaining.DeleteLabelValues(label)
	runs, err := in.restoreRunsDir(p, be, meta)
	if err != nil {
		return changelog.Result{}, err
	}
	wrote := false
	var bulkMeta *kstate.Meta // the last batch's, when it went through ApplyBulk
	params := changelog.RestoreParams{
		Admin:       in.adm,
		ClientOpts:  in.baseOpts(),
		Topic:       in.changelogTopic,
		Partition:   p,
		From:        meta.ChangelogOffset,
		Group:       in.cfg.AppID,
		InputTopics: in.cfg.InputTopics,
		Applied:     applied,
		RunsDir:     runs,
		Admit: func(ctx context.Context, records int64) (func(), error) {
			return in.admitRestore(ctx, p, records)
		},
		Apply: func(muts []kstate.Mutation, m kstate.Meta) error {
			wrote = true
			// A store loaded from empty (or from partial) in many
			// batches: one that is whole takes the few records it
			// missed with the freelist that spares its next open a
			// walk over every page after a crash.
			if bulk, ok := be.(kstate.BulkApplier); ok && runs != "" {
				if err := bulk.ApplyBulk(muts, m); err != nil {
					return err
				}
				last := m.Clone()
				bulkMeta = &last
				return nil
			}
			return be.Apply(muts, m)
		},
		Progress: func(done, remaining int64) {
			in.m.restoreDone.WithLabelValues(label).Set(float64(done))
			in.m.restoreRemaining.WithLabelValues(label).Set(float64(remaining))
		},
		Logf: func(msg string, args ...any) { in.log.Info(msg, args...) },
	}
	if adapt != nil {
		adapt(&params)
	}
	res, err := changelog.Restore(ctx, params)
	if err == nil && bulkMeta != nil {
		// The batches left what speeds up the next open unwritten (bbolt's
		// freelist): write it now rather than at the task's first epoch,
		// which an idle task may not have for long, so that a crash until
		// then does not cost the next open a walk over every page.
		err = be.Apply(nil, *bulkMeta)
	}
	// Nothing new, but the store is now known to be current: say so, or
	// a task idle for long would look stale at its next start. A live
	// read (a standby's round) says so once a minute, not every round.
	if err == nil && !wrote && len(meta.Offsets) > 0 && (!params.Live || in.now().Sub(meta.AppliedAt) > time.Minute) {
		meta.AppliedAt = in.now()
		err = be.Apply(nil, meta)
	}
	return res, err
}

// wholeCopy reports whether a store's meta is that of a copy complete to
// an epoch marker: neither empty nor cut between two markers.
func wholeCopy(meta kstate.Meta) bool { return len(meta.Offsets) > 0 && !meta.Partial }

// restoreRunsDir is where a restore of task p sorts the changelog before
// applying it (changelog.RestoreParams.RunsDir): into an empty bbolt store,
// or one a restore left partial. It is "" for a store that is whole (the
// restore reads only what it missed) or lives in memory (whose apply
// merges a sorted slice whatever the order). The runs of a restore that
// crashed are deleted either way.
func (in *Instance) restoreRunsDir(p int32, be kstate.Backend, meta kstate.Meta) (string, error) {
	if in.cfg.Backend != "bbolt" {
		return "", nil
	}
	dir := in.restoreRunsPath(p)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("task %d: delete the runs of an earlier restore: %w", p, err)
	}
	if be.Stats().Keys > 0 && !meta.Partial {
		return "", nil
	}
	return dir, nil
}

// restoreRunsPrefix names the directories of restores' runs in the state
// dir: restore-runs-NNNN (restoreRunsPath).
const restoreRunsPrefix = "restore-runs-"

func (in *Instance) restoreRunsPath(p int32) string {
	return filepath.Join(in.stateDir(), fmt.Sprintf("%s%04d", restoreRunsPrefix, p))
}

// removeRestoreRuns deletes every restore's runs left in the state dir by a
// process that stopped during a restore (its task may restore elsewhere
// now). Called before any restore starts.
func (in *Instance) removeRestoreRuns() {
	if in.cfg.Backend != "bbolt" {
		return
	}
	entries, err := os.ReadDir(in.stateDir())
	if err != nil {
		return // no state dir yet
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), restoreRunsPrefix) {
			path := filepath.Join(in.stateDir(), e.Name())
			if err := os.RemoveAll(path); err != nil {
				in.log.Warn("deleting the runs of an interrupted restore failed", "dir", path, "err", err)
			}
		}
	}
}

// maxEntryBytes bounds one state entry so that its changelog record fits
// the producer's batch limit (see sizeBatches), with room for the batch and
// record framing and the epoch header.
func (in *Instance) maxEntryBytes() int {
	const framing = 512
	return in.batchMax - framing
}
