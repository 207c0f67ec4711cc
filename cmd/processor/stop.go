package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/savepoint"
)

// stopFlags are the flags of `processor savepoint`.
type stopFlags struct {
	stop    bool
	drain   bool
	oneJob  bool
	timeout time.Duration
}

func parseSavepointFlags(args []string, stderr io.Writer) (stopFlags, error) {
	var f stopFlags
	fs := flag.NewFlagSet("savepoint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&f.stop, "stop", false, "stop the app first: every instance takes a final checkpoint and leaves the group; the savepoint is then exactly where they stopped")
	fs.BoolVar(&f.drain, "drain", false, "with --stop: first wait until the group has committed every input record (pause the producers before)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "with --stop: how long to wait for the drain, for the instances to stop and for the savepoint")
	fs.BoolVar(&f.oneJob, "one-job", false, "take the app for one job although topics named like a pipeline's repartition topics exist and no pipeline recorded its stages (they are another app's)")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if f.drain && !f.stop {
		return f, errors.New("--drain needs --stop")
	}
	return f, nil
}

// stopApp is `processor savepoint --stop`: it asks every instance of the
// app to stop (a "stopped" record in the control topic), waits until the
// group has no members, takes the savepoint, and checks that nothing was
// committed past its cuts meanwhile. The app stays stopped (instances that
// start wait, without joining) until `processor resume`.
func stopApp(ctx context.Context, log *slog.Logger, cfg SavepointConfig, f stopFlags, stages []string) (string, error) {
	cl, _, err := adminClient(cfg.Brokers, cfg.Security)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	// The consumer groups: the app's, and each later stage's of a
	// pipeline, which all follow the app's control topic.
	groups, inputs := []string{cfg.AppID}, [][]string{nil}
	for _, s := range stages {
		groups = append(groups, cfg.AppID+"-"+s)
		inputs = append(inputs, []string{sluice.RepartitionTopic(cfg.AppID, s)})
	}
	if f.drain {
		start := time.Now()
		if err := waitDrained(ctx, log, cl, adm, groups, inputs); err != nil {
			return "", fmt.Errorf("drain: %w", err)
		}
		log.Info("input drained", "took", time.Since(start).Round(time.Millisecond).String())
	}
	id := fmt.Sprintf("stop-%d", time.Now().UnixNano())
	if err := writeControl(ctx, cl, adm, cfg.AppID, control.State{State: control.Stopped, ID: id, At: time.Now().UTC()}); err != nil {
		return "", err
	}
	start := time.Now()
	for _, g := range groups {
		if err := waitGroupEmpty(ctx, log, adm, g); err != nil {
			return "", fmt.Errorf("waiting for the instances to stop (group %s): %w", g, err)
		}
	}
	log.Info("every instance stopped", "request", id, "took", time.Since(start).Round(time.Millisecond).String())
	// A pipeline's later stages start a new app from its repartition
	// topics' log start (their old offsets name the old app's topics), so
	// a record that one stage forwarded and the next had not committed at
	// the stop would be in neither stage's part: refuse before writing.
	if err := checkHops(ctx, log, cl, adm, groups[1:], inputs[1:]); err != nil {
		return "", fmt.Errorf("%w; no savepoint was written. The app stays stopped: `processor resume`, pause the producers, and take it again with --stop --drain", err)
	}
	dir, ms, err := writeSavepoint(ctx, log, cfg, stages)
	if err != nil {
		return "", err
	}
	// Ordering rule: the savepoint is only where the app stopped if no
	// instance committed while it was taken (one that does not follow
	// the control topic, say), nor forwarded a record to a stage.
	for _, g := range groups {
		if n, err := groupMembers(ctx, adm, g); err != nil || n > 0 {
			return "", fmt.Errorf("the group %s has %d members again after the savepoint %s was taken (%v): an instance that does not follow the control topic? the savepoint may be behind it", g, n, dir, err)
		}
		if err := checkCuts(ctx, adm, g, ms[g]); err != nil {
			return "", fmt.Errorf("savepoint %s: %w", dir, err)
		}
	}
	if err := checkHops(ctx, log, cl, adm, groups[1:], inputs[1:]); err != nil {
		return "", fmt.Errorf("savepoint %s: %w after it was taken: do not restore from it", dir, err)
	}
	return dir, nil
}

// checkHops checks, the app stopped, that no record is in flight to a
// later stage of a pipeline: each stage's group has committed its whole
// repartition topic (past control records). A new app's later stages start
// at their own repartition topics' start, so such a record would be in
// neither stage's part of a savepoint. Offsets that cannot be listed now
// are asked again until ctx ends.
func checkHops(ctx context.Context, log *slog.Logger, cl *kgo.Client, adm *kadm.Client, groups []string, inputs [][]string) error {
	for i, g := range groups {
		var behind int64
		var last error
		err := poll(ctx, func() (bool, error) {
			if behind, _, last = behindOf(ctx, cl, adm, g, inputs[i]); last != nil {
				log.Warn("listing a stage's offsets failed; retrying", "group", g, "err", last)
				return false, nil
			}
			return true, nil
		})
		if err != nil {
			return fmt.Errorf("whether records are in flight to stage group %s is not known: %w (last: %v)", g, err, last)
		}
		if behind > 0 {
			return fmt.Errorf("%d records were in flight to stage group %s when the app stopped, which a savepoint cannot hold", behind, g)
		}
	}
	return nil
}

// writeControl appends s to the app's control topic, creating the topic
// when it is missing (an app whose instances predate it).
func writeControl(ctx context.Context, cl *kgo.Client, adm *kadm.Client, app string, s control.State) error {
	if err := control.Create(ctx, adm, app); err != nil {
		return err
	}
	topic := control.TopicName(app)
	rec := &kgo.Record{Topic: topic, Key: control.StateKey, Value: control.Encode(s)}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("write %s to %s: %w", s.State, topic, err)
	}
	return nil
}

// groupMembers counts the group's members under either protocol. A group
// that does not exist (under one protocol or both) has none; any other
// error is returned, so that the caller asks again rather than take a
// coordinator that could not answer for an empty group.
func groupMembers(ctx context.Context, adm *kadm.Client, app string) (int, error) {
	absent := func(err error) bool {
		return errors.Is(err, kerr.GroupIDNotFound) || errors.Is(err, kerr.UnsupportedVersion) || errors.Is(err, kerr.InvalidGroupID)
	}
	classic, err := adm.DescribeGroups(ctx, app)
	if err != nil {
		return 0, err
	}
	n := 0
	if d := classic[app]; d.Err != nil && !absent(d.Err) {
		return 0, fmt.Errorf("describe group %s: %w", app, d.Err)
	} else if d.Err == nil {
		n += len(d.Members)
	}
	consumer, err := adm.DescribeConsumerGroups(ctx, app)
	if err != nil && !absent(err) {
		return 0, err
	}
	if d, ok := consumer[app]; ok {
		if d.Err != nil && !absent(d.Err) {
			return 0, fmt.Errorf("describe consumer group %s: %w", app, d.Err)
		}
		n += len(d.Members)
	}
	return n, nil
}

// poll calls done every 100 ms until it reports true or fails, or ctx ends.
func poll(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitGroupEmpty waits until two answers in a row say the group has no
// members.
func waitGroupEmpty(ctx context.Context, log *slog.Logger, adm *kadm.Client, app string) error {
	last, empty := -1, 0
	return poll(ctx, func() (bool, error) {
		n, err := groupMembers(ctx, adm, app)
		if err != nil {
			log.Warn("describing the group failed; retrying", "err", err)
			empty = 0
			return false, nil
		}
		if n != last && n > 0 {
			log.Info("waiting for the instances to stop", "members", n)
		}
		last = n
		if n > 0 {
			empty = 0
			return false, nil
		}
		empty++
		return empty >= 2, nil
	})
}

// waitDrained waits until each group's committed offsets reach the end of
// every input partition it has offsets for. A partition whose records past
// the committed offset are all control records (the commit marker that
// ends a transactional producer's input, which no consumer commits past)
// is drained too.
//
// With several groups, a pipeline's, one group's drain can undo another's
// (a stage still forwarding refills the next stage's input), and their
// order is not known here: they are drained once two rounds in a row find
// every group drained and no input's end moved between them, so that no
// stage consumed or forwarded anything in between.
func waitDrained(ctx context.Context, log *slog.Logger, cl *kgo.Client, adm *kadm.Client, groups []string, inputs [][]string) error {
	var last map[string]int64 // the ends of the last round that found all drained
	return poll(ctx, func() (bool, error) {
		total := int64(0)
		ends := map[string]int64{}
		for i, g := range groups {
			behind, gEnds, err := behindOf(ctx, cl, adm, g, inputs[i])
			if err != nil {
				if errors.Is(err, errNoOffsets) {
					return false, err
				}
				log.Warn("fetching a group's offsets failed; retrying", "group", g, "err", err)
				return false, nil
			}
			total += behind
			maps.Copy(ends, gEnds)
		}
		if total > 0 {
			log.Info("waiting for the input to drain", "records_behind", total)
			last = nil
			return false, nil
		}
		done := len(groups) == 1 || last != nil && maps.Equal(last, ends)
		last = ends
		return done, nil
	})
}

// errNoOffsets: a group has committed no offsets.
var errNoOffsets = errors.New("has committed no offsets: has it run?")

// behindOf counts the records of the group's input partitions past its
// stable committed offsets (partitions whose records past it are all
// control records count none), and returns the ends it compared with, by
// "topic/partition". The inputs are topics, or nil for those the group
// has committed offsets for (an app's input topics are not known here; a
// pipeline stage's is its repartition topic, which it may not have
// committed offsets for yet).
func behindOf(ctx context.Context, cl *kgo.Client, adm *kadm.Client, group string, topics []string) (int64, map[string]int64, error) {
	committed, err := adm.FetchOffsets(kadm.RequireStable(ctx), group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		// A group that never committed (Kafka answers such a group with
		// no offsets, some brokers with this error).
		committed, err = kadm.OffsetResponses{}, nil
	}
	if err == nil {
		err = committed.Error() // a partition's (UNSTABLE_OFFSET_COMMIT): ask again
	}
	if err != nil {
		return 0, nil, err
	}
	if topics == nil {
		topics = committed.Offsets().TopicsSet().Topics()
	}
	if len(topics) == 0 {
		return 0, nil, fmt.Errorf("group %s %w", group, errNoOffsets)
	}
	endOffsets, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return 0, nil, err
	}
	startOffsets, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return 0, nil, err
	}
	// A partition whose offsets could not be listed (a leader moving, a
	// topic gone) is not known to be drained: every one must answer.
	if err := endOffsets.Error(); err != nil {
		return 0, nil, fmt.Errorf("end offsets of %s: %w", strings.Join(topics, ", "), err)
	}
	if err := startOffsets.Error(); err != nil {
		return 0, nil, fmt.Errorf("start offsets of %s: %w", strings.Join(topics, ", "), err)
	}
	behind, ends := int64(0), map[string]int64{}
	for _, o := range endOffsets.Offsets().Sorted() {
		ends[fmt.Sprintf("%s/%d", o.Topic, o.Partition)] = o.At
		c, ok := committed.Lookup(o.Topic, o.Partition)
		if ok && c.At >= o.At {
			continue
		}
		// Without a committed offset the group has read nothing of the
		// partition: it is behind by what its log still holds, unless
		// that is only control records (aborted transactions' markers).
		from := c.At
		if s, sok := startOffsets.Lookup(o.Topic, o.Partition); !ok || from < s.Offset {
			if !sok {
				return 0, nil, fmt.Errorf("no start offset of %s/%d", o.Topic, o.Partition)
			}
			from = s.Offset
		}
		if from >= o.At {
			continue
		}
		only, err := onlyControlRecords(ctx, cl, o.Topic, o.Partition, from, o.At)
		if err != nil {
			return 0, nil, err
		}
		if !only {
			behind += o.At - from
		}
	}
	return behind, ends, nil
}

// onlyControlRecords reports whether [from, end) of a partition holds no
// record a read_committed consumer would see. It reads with its own
// consumer: cl's options connect it.
func onlyControlRecords(ctx context.Context, cl *kgo.Client, topic string, p int32, from, end int64) (bool, error) {
	rd, err := kgo.NewClient(append(cl.Opts(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(100*time.Millisecond),
	)...)
	if err != nil {
		return false, err
	}
	defer rd.Close()
	for {
		fs := rd.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return false, err
		}
		if err := fetchError(fs); err != nil {
			return false, fmt.Errorf("read %s/%d: %w", topic, p, err)
		}
		only, last := true, int64(-1)
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < end && !r.Attrs.IsControl() {
				only = false
			}
			last = max(last, r.Offset)
		})
		if !only {
			return false, nil
		}
		if last >= end-1 {
			return true, nil
		}
	}
}

// checkCuts checks that the group's stable committed offsets are where the
// savepoint's tasks were cut: an instance that committed later would have
// moved the app past the savepoint.
func checkCuts(ctx context.Context, adm *kadm.Client, app string, m savepoint.Manifest) error {
	committed, err := adm.FetchOffsets(kadm.RequireStable(ctx), app)
	if err != nil {
		return fmt.Errorf("fetch the group's offsets: %w", err)
	}
	for _, t := range m.Tasks {
		for topic, cut := range t.Offsets {
			if c, ok := committed.Lookup(topic, t.Partition); ok && c.At > cut {
				return fmt.Errorf("the group committed %s/%d up to %d, past the savepoint's cut at %d", topic, t.Partition, c.At, cut)
			}
		}
	}
	return nil
}

// runResume is `processor resume`: the app runs again (instances waiting
// for it join the group).
func runResume(envm map[string]string) int {
	cfg, err := loadAppConfig(envm)
	if err != nil {
		return configFail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cl, _, err := adminClient(cfg.Brokers, cfg.Security)
	if err == nil {
		defer cl.Close()
		err = writeControl(ctx, cl, kadm.NewClient(cl), cfg.AppID, control.State{State: control.Running, ID: fmt.Sprintf("resume-%d", time.Now().UnixNano()), At: time.Now().UTC()})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "processor resume:", err)
		return 1
	}
	fmt.Println("resumed", cfg.AppID)
	return 0
}
