package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/kstate"
	"github.com/sluicehq/sluice/savepoint"
)

// runSavepoint takes a savepoint of SLUICE_APP_ID from its changelog
// (with --stop, of the app stopped).
func runSavepoint(envm map[string]string, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return takeSavepoint(ctx, envm, args, os.Stdout, os.Stderr)
}

// takeSavepoint is `processor savepoint` with its streams: the savepoint's
// location (a path, or an s3:// or gs:// URL, as SLUICE_RESTORE_FROM takes it) is the
// last line of stdout; progress (JSON log lines) and errors go
// to stderr. It returns the exit status: 0, 1 on a failure, 2 on a bad
// variable.
func takeSavepoint(ctx context.Context, envm map[string]string, args []string, stdout, stderr io.Writer) int {
	flags, err := parseSavepointFlags(args, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "processor savepoint:", err)
		return 2
	}
	cfg, err := loadSavepointConfig(envm)
	if err != nil {
		fmt.Fprintln(stderr, "processor:", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	for _, w := range cfg.warnings() {
		log.Warn(w)
	}
	var loc string
	var stages []string
	if stages, err = appStages(ctx, cfg, flags.oneJob); err == nil {
		switch {
		case flags.stop:
			loc, err = stopApp(ctx, log, cfg, flags, stages)
		case len(stages) > 0:
			// Each stage's cut is its own epoch's: records in flight
			// between them at the cuts would be in neither stage's part.
			err = fmt.Errorf("%s is a pipeline (later stages: %s): its savepoint needs --stop, and --drain unless no record is in flight between its stages", cfg.AppID, strings.Join(stages, ", "))
		default:
			loc, _, err = writeSavepoint(ctx, log, cfg, nil)
		}
	}
	if err != nil {
		log.Error("savepoint failed", "err", err)
		return 1
	}
	fmt.Fprintln(stdout, loc)
	return 0
}

// writeSavepoint copies every changelog partition of the app, up to its
// last epoch marker, into a new savepoint under SLUICE_SAVEPOINT_DIR and
// returns its location and the manifest of each app id in it: the app's,
// and for a pipeline each later stage's, <app>-<stage>, whose savepoint
// goes in a directory of its own under the app's (savepoint.FormatPipeline;
// stages names them, found by the caller).
//
// Each task's cut is its last committed epoch: changelog.Restore reads
// read_committed and applies nothing past the last marker, so the state
// and the offsets in the savepoint agree task by task while instances keep
// running. The tasks' cuts are independent epochs, not one moment of the
// whole app (stopping with a savepoint, stopApp, gives that, which a
// pipeline needs).
//
// Each partition is restored into a bbolt file in a temporary directory,
// then scanned in key order into its data file: memory stays bounded by the
// restore's batch whatever the state's size, where the memory backend
// would hold a whole task. The temporary file is removed after each task.
func writeSavepoint(ctx context.Context, log *slog.Logger, cfg SavepointConfig, stages []string) (string, map[string]savepoint.Manifest, error) {
	cl, opts, err := adminClient(cfg.Brokers, cfg.Security)
	if err != nil {
		return "", nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	created := time.Now().UTC()
	loc, err := savepoint.Join(cfg.Dir, cfg.AppID+"-"+created.Format("20060102T150405.000Z"))
	if err != nil {
		return "", nil, fmt.Errorf("SLUICE_SAVEPOINT_DIR: %w", err)
	}
	scratch, err := os.MkdirTemp("", "sluice-savepoint-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(scratch)
	// The app's writer first: it claims the location, which must hold
	// nothing yet; the stages' go under it, and its manifest, last, makes
	// the whole a savepoint.
	w, err := savepoint.Create(ctx, loc, savepoint.Manifest{AppID: cfg.AppID, Created: created, ChangelogTopic: changelog.TopicName(cfg.AppID)})
	if err != nil {
		return "", nil, err
	}
	manifests := map[string]savepoint.Manifest{}
	err = saveApp(ctx, log, adm, opts, w, scratch, cfg.AppID)
	for _, stage := range stages {
		if err != nil {
			break
		}
		app := cfg.AppID + "-" + stage
		var sloc string
		if sloc, err = savepoint.Join(loc, savepoint.StageDir(stage)); err != nil {
			break
		}
		var sw *savepoint.Writer
		if sw, err = savepoint.Create(ctx, sloc, savepoint.Manifest{AppID: app, Created: created, ChangelogTopic: changelog.TopicName(app)}); err != nil {
			break
		}
		if err = saveApp(ctx, log, adm, opts, sw, scratch, app); err != nil {
			sw.Abort(context.WithoutCancel(ctx)) // the app's Abort below removes it anyway
			break
		}
		manifests[app], err = sw.Commit(ctx)
	}
	if err == nil {
		w.SetStages(stages)
		manifests[cfg.AppID], err = w.Commit(ctx)
	}
	if err != nil {
		// Without its manifest the location is no savepoint: leave
		// nothing that looks like one, even when ctx ended (SIGTERM).
		if aerr := w.Abort(context.WithoutCancel(ctx)); aerr != nil {
			log.Error("removing the incomplete savepoint failed", "location", w.Location(), "err", aerr)
		}
		return "", nil, err
	}
	log.Info("savepoint written", "location", w.Location(), "stages", len(stages)+1)
	return w.Location(), manifests, nil
}

// saveApp writes every task of app (one job, or one stage of a pipeline)
// with w, which it leaves to the caller to commit.
func saveApp(ctx context.Context, log *slog.Logger, adm *kadm.Client, opts []kgo.Opt, w *savepoint.Writer, scratch, app string) error {
	topic := changelog.TopicName(app)
	partitions, err := changelogPartitions(ctx, adm, topic)
	if err != nil {
		return err
	}
	var inputs []string
	job := ""
	for p := range partitions {
		m, err := savepointTask(ctx, log, adm, opts, w, scratch, topic, p)
		if err != nil {
			return err
		}
		if m == nil {
			continue
		}
		if m.Job != "" && job != "" && m.Job != job {
			return fmt.Errorf("the tasks' epoch markers of %s name two jobs, %q and %q: was the app restarted with another job mid-way?", app, job, m.Job)
		}
		if m.Job != "" {
			job = m.Job
		}
		for name := range m.Offsets {
			if !slices.Contains(inputs, name) {
				inputs = append(inputs, name)
			}
		}
	}
	slices.Sort(inputs)
	w.SetJob(job)
	w.SetInputs(inputsOf(inputs, partitions))
	return nil
}

func inputsOf(topics []string, partitions int32) []savepoint.Input {
	in := make([]savepoint.Input, 0, len(topics))
	for _, t := range topics {
		in = append(in, savepoint.Input{Topic: t, Partitions: partitions})
	}
	return in
}

// savepointTask restores changelog partition p into a scratch bbolt file
// and writes it as the savepoint's task p. It returns the task's last
// marker, nil when it has none.
func savepointTask(ctx context.Context, log *slog.Logger, adm *kadm.Client, opts []kgo.Opt, w *savepoint.Writer, scratch, topic string, p int32) (*changelog.Marker, error) {
	task := fmt.Sprintf("task-%d", p)
	be, err := kstate.OpenBolt(kstate.BoltPath(scratch, task))
	if err != nil {
		return nil, err
	}
	defer func() {
		be.Close()
		os.Remove(kstate.BoltPath(scratch, task))
	}()
	res, err := changelog.Restore(ctx, changelog.RestoreParams{
		Admin:      adm,
		ClientOpts: opts,
		Topic:      topic,
		Partition:  p,
		// No Group: the savepoint's cut is the last marker, whatever
		// the group committed since; checking the group against it
		// would chase a running app's newer epochs.
		Apply: be.Apply,
		// Sorted first, as a task's restore from scratch is (its state
		// would be as slow to build in random key order): beside the
		// scratch file, deleted when the restore returns.
		RunsDir: filepath.Join(scratch, task+"-runs"),
		Logf:    func(msg string, args ...any) { log.Info(msg, args...) },
	})
	if err != nil {
		return nil, fmt.Errorf("task %d: %w", p, err)
	}
	cut := savepoint.Cut{Partition: p}
	if m := res.Last; m != nil {
		cut.Epoch, cut.Offsets, cut.Watermark = m.Epoch, m.Offsets, m.Watermark
	}
	t, err := w.WriteTask(ctx, cut, be)
	if err != nil {
		return nil, err
	}
	log.Info("task saved", "task", p, "epoch", t.Epoch, "records_read", res.Records, "keys_written", t.Keys, "bytes", t.Bytes)
	return res.Last, nil
}

// errNoChangelog is returned (wrapped) when the app has no changelog topic:
// it never ran, or SLUICE_APP_ID names another app.
var errNoChangelog = errors.New("no changelog topic")

func changelogPartitions(ctx context.Context, adm *kadm.Client, topic string) (int32, error) {
	details, err := adm.ListTopics(ctx) // all topics: naming a missing one makes the client retry it for seconds
	if err != nil {
		return 0, fmt.Errorf("list topics: %w", err)
	}
	d, ok := details[topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return 0, fmt.Errorf("%w %s: has an instance of SLUICE_APP_ID run yet?", errNoChangelog, topic)
	}
	if d.Err != nil {
		return 0, fmt.Errorf("describe %s: %w", topic, d.Err)
	}
	return int32(len(d.Partitions)), nil
}

// pipelineStages are the later stages of app if it is a pipeline, as it
// recorded them in its control topic (control.PipelineKey) at its last
// start; none for one job's app. Topics named like a stage's repartition
// topic (<app>-<stage>-repartition) are not enough: they could be another
// app's, <app>-<x>. Such topics without the record are refused
// (errAmbiguous), unless oneJob (--one-job) says the app is one job.
func pipelineStages(ctx context.Context, cl *kgo.Client, adm *kadm.Client, app string, oneJob bool) ([]string, error) {
	details, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var named []string
	for name := range details {
		if stage, ok := stageOf(app, name); ok {
			named = append(named, stage)
		}
	}
	slices.Sort(named)
	rec, err := lastControlRecord(ctx, cl, adm, app, control.PipelineKey)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		if len(named) > 0 && !oneJob {
			return nil, fmt.Errorf("%w: topics are named like repartition topics of stages of %s (%s), but no pipeline recorded its stages in %s. A pipeline records them at each start (this release on; it needs WRITE there): restart it first. If the topics are another app's (%s-<x>), take the savepoint with --one-job", errAmbiguous, app, strings.Join(named, ", "), control.TopicName(app), app)
		}
		return nil, nil
	}
	p, err := control.DecodePipeline(rec)
	if err != nil {
		return nil, err
	}
	for _, s := range p.Stages {
		if !slices.Contains(named, s) {
			return nil, fmt.Errorf("%s records the pipeline stage %s, whose repartition topic %s is missing", app, s, sluice.RepartitionTopic(app, s))
		}
	}
	return slices.Sorted(slices.Values(p.Stages)), nil
}

// lastControlRecord is the value of the last record under key in app's
// control topic, nil when there is none (or no control topic).
func lastControlRecord(ctx context.Context, cl *kgo.Client, adm *kadm.Client, app string, key []byte) ([]byte, error) {
	topic := control.TopicName(app)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("control topic %s: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("control topic %s: %w", topic, err)
	}
	o, ok := ends.Lookup(topic, 0)
	if !ok || errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
		return nil, nil
	}
	s, sok := starts.Lookup(topic, 0)
	switch {
	case o.Err != nil:
		return nil, fmt.Errorf("control topic %s: end offset: %w", topic, o.Err)
	case !sok || s.Err != nil:
		return nil, fmt.Errorf("control topic %s: start offset: %v", topic, s.Err)
	case s.Offset >= o.Offset:
		return nil, nil // empty, or emptied by retention
	}
	rd, err := kgo.NewClient(append(cl.Opts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchMaxWait(100*time.Millisecond),
	)...)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	var last []byte
	for {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := fetchError(fs); err != nil {
			return nil, fmt.Errorf("read control topic %s: %w", topic, err)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			if bytes.Equal(r.Key, key) {
				last = r.Value
			}
			done = done || r.Offset >= o.Offset-1
		})
		if done {
			return last, nil
		}
	}
}

// appStages is pipelineStages of SLUICE_APP_ID, with a client of its own.
func appStages(ctx context.Context, cfg SavepointConfig, oneJob bool) ([]string, error) {
	cl, _, err := adminClient(cfg.Brokers, cfg.Security)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return pipelineStages(ctx, cl, kadm.NewClient(cl), cfg.AppID, oneJob)
}

// errAmbiguous: the app may be a pipeline that has not recorded its
// stages.
var errAmbiguous = errors.New("not known to be one job")

// fetchError is the first error of a poll that is not one franz-go retries
// by itself (an ACL denial, say), nil if none.
func fetchError(fs kgo.Fetches) error {
	var err error
	fs.EachError(func(_ string, _ int32, e error) {
		if err == nil && !kerr.IsRetriable(e) {
			err = e
		}
	})
	return err
}
