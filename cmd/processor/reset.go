package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/control"
	"github.com/sluicehq/sluice/internal/groupview"
)

// runReset deletes what SLUICE_APP_ID keeps, so that it starts from scratch.
func runReset(args []string, envm map[string]string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return resetApp(ctx, args, envm, os.Stdout, os.Stderr)
}

// resetPlan is what a reset deletes.
type resetPlan struct {
	groups    []string // the consumer groups that exist
	topics    []string // internal topics that exist
	stateDirs []string // this machine's state dirs
}

// resetApp is `processor reset [--yes]` with its streams: without --yes it
// prints what it would delete and deletes nothing. It returns the exit
// status: 0, 1 on a failure or while the group has members, 2 on a bad
// flag or variable.
//
// Ordering rule: the group is deleted first. The broker refuses to delete
// a group with members (NON_EMPTY_GROUP), so an instance that joined after
// the check stops the reset before anything it needs is gone; a changelog
// deleted under a running instance would instead leave it restoring from a
// topic that no longer exists.
func resetApp(ctx context.Context, args []string, envm map[string]string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reset", flag.ContinueOnError)
	fs.SetOutput(stderr)
	yes := fs.Bool("yes", false, "delete (without it: print what would be deleted)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := loadResetConfig(envm)
	if err != nil {
		fmt.Fprintln(stderr, "processor:", err)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "processor: reset:", err)
		return 1
	}
	cl, _, err := adminClient(cfg.Brokers, cfg.Security)
	if err != nil {
		return fail(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	app := cfg.AppID

	plan, apps, err := planReset(ctx, adm, app, cfg.StateDir)
	if err != nil {
		return fail(err)
	}
	// The app, and each later stage of a pipeline (sluice.NewPipeline):
	// a stage runs as an app id of its own, <app>-<stage>.
	for _, a := range apps {
		g, err := groupview.Describe(ctx, cl, adm, a)
		if err != nil {
			return fail(err)
		}
		if n := len(g.Members); n > 0 {
			// A dry run refuses too: what a reset would delete is not
			// what a running app will have by the time it stops.
			return fail(fmt.Errorf("group %s has %s (%s): stop every instance first", a, count(n, "member"), memberNames(g.Members)))
		}
		if g.State != "Dead" {
			plan.groups = append(plan.groups, a)
		}
	}

	verb := "would delete"
	if *yes {
		verb = "deleted"
		for _, group := range plan.groups {
			if err := deleteGroup(ctx, adm, group); err != nil {
				return fail(err)
			}
		}
		if len(plan.topics) > 0 {
			resp, err := adm.DeleteTopics(ctx, plan.topics...)
			if err == nil {
				err = resp.Error()
			}
			if err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
				return fail(fmt.Errorf("delete topics %s: %w", strings.Join(plan.topics, ", "), err))
			}
		}
		for _, dir := range plan.stateDirs {
			if err := os.RemoveAll(dir); err != nil {
				return fail(fmt.Errorf("delete state dir: %w", err))
			}
		}
		fmt.Fprintf(stdout, "reset of app %s:\n", app)
	} else {
		fmt.Fprintf(stdout, "reset of app %s (dry run: nothing deleted; run with --yes to delete):\n", app)
	}
	if len(plan.groups) == 0 && len(plan.topics) == 0 && len(plan.stateDirs) == 0 {
		fmt.Fprintf(stdout, "  nothing to delete: no group %s, no internal topics, no state dir %s\n", app, filepath.Join(cfg.StateDir, app))
	}
	for _, group := range plan.groups {
		fmt.Fprintf(stdout, "  %s consumer group %s (its committed offsets)\n", verb, group)
	}
	for _, t := range plan.topics {
		fmt.Fprintf(stdout, "  %s topic %s\n", verb, t)
	}
	for _, dir := range plan.stateDirs {
		fmt.Fprintf(stdout, "  %s state dir %s (this machine's only: delete every other instance's too)\n", verb, dir)
	}
	fmt.Fprintf(stdout, "  kept: the output topics and the DLQ topic (%s-dlq unless SLUICE_DLQ_TOPIC names another) are yours to keep or delete\n", app)
	return 0
}

// planReset finds the app's internal topics and local state dirs, and the
// app ids whose groups go too: the app's, and those of a pipeline's later
// stages, <app>-<stage>, one for each repartition topic
// <app>-<stage>-repartition (each with a changelog and state dir of its
// own).
func planReset(ctx context.Context, adm *kadm.Client, app, stateRoot string) (resetPlan, []string, error) {
	var plan resetPlan
	details, err := adm.ListTopics(ctx)
	if err != nil {
		return plan, nil, fmt.Errorf("list topics: %w", err)
	}
	apps := []string{app}
	for _, t := range details.Names() {
		if stage, ok := stageOf(app, t); ok {
			apps = append(apps, app+"-"+stage)
		}
	}
	for _, t := range details.Names() {
		if isInternalTopic(app, t) || slices.ContainsFunc(apps[1:], func(a string) bool { return t == changelog.TopicName(a) }) {
			plan.topics = append(plan.topics, t)
		}
	}
	slices.Sort(plan.topics)
	for _, a := range apps {
		// The engine keeps an app's task files in <SLUICE_STATE_DIR>/<app>.
		dir, err := filepath.Abs(filepath.Join(stateRoot, a))
		if err != nil {
			return plan, nil, fmt.Errorf("SLUICE_STATE_DIR: %w", err)
		}
		switch _, err := os.Stat(dir); {
		case err == nil:
			plan.stateDirs = append(plan.stateDirs, dir)
		case !errors.Is(err, os.ErrNotExist):
			return plan, nil, fmt.Errorf("state dir: %w", err)
		}
	}
	return plan, apps, nil
}

// isInternalTopic reports whether topic is one the app made for itself:
// its changelog, its control topic, or a repartition topic
// <app>-<name>-repartition. A repartition topic of another app whose id
// starts with "<app>-" matches too; the dry run shows what would go.
func isInternalTopic(app, topic string) bool {
	switch topic {
	case changelog.TopicName(app), control.TopicName(app):
		return true
	}
	_, ok := stageOf(app, topic)
	return ok
}

// stageOf is the stage whose repartition topic (sluice.RepartitionTopic)
// topic is, if it is one of app's.
func stageOf(app, topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, app+"-")
	stage, ok2 := strings.CutSuffix(rest, "-repartition")
	return stage, ok && ok2 && stage != ""
}

func deleteGroup(ctx context.Context, adm *kadm.Client, group string) error {
	resp, err := adm.DeleteGroup(ctx, group)
	if err == nil {
		err = resp.Err
	}
	switch {
	case err == nil, errors.Is(err, kerr.GroupIDNotFound):
		return nil
	case errors.Is(err, kerr.NonEmptyGroup):
		return fmt.Errorf("group %s has members again: stop every instance first (nothing deleted)", group)
	}
	return fmt.Errorf("delete group %s: %w", group, err)
}

func memberNames(ms []groupview.Member) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.InstanceID
		if names[i] == "" {
			names[i] = m.MemberID
		}
	}
	return strings.Join(names, ", ")
}
