package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/changelog"
	"github.com/sluicehq/sluice/internal/groupview"
)

// runInspect shows SLUICE_APP_ID as Kafka sees it.
func runInspect(args []string, envm map[string]string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return inspectApp(ctx, args, envm, os.Stdout, os.Stderr)
}

// inspectApp is `processor inspect [--json]` with its streams. It returns
// the exit status: 0, 1 on a failure, 2 on a bad flag or variable.
func inspectApp(ctx context.Context, args []string, envm map[string]string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON document instead of tables")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := loadAppConfig(envm)
	if err != nil {
		fmt.Fprintln(stderr, "processor:", err)
		return 2
	}
	cl, opts, err := adminClient(cfg.Brokers, cfg.Security)
	if err != nil {
		fmt.Fprintln(stderr, "processor: inspect:", err)
		return 1
	}
	defer cl.Close()
	in, err := inspect(ctx, cl, opts, cfg.AppID, time.Now())
	if err != nil {
		fmt.Fprintln(stderr, "processor: inspect:", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(in)
	} else {
		err = in.print(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "processor: inspect:", err)
		return 1
	}
	return 0
}

// adminClient is the client of the commands that look at an app from
// outside (savepoint, inspect, reset): the TLS/SASL options of sec and the
// seed brokers. opts are for the further clients a command makes.
func adminClient(brokers []string, sec Security) (*kgo.Client, []kgo.Opt, error) {
	opts, err := sec.kafkaOpts()
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, kgo.SeedBrokers(brokers...))
	cl, err := kgo.NewClient(opts...)
	return cl, opts, err
}

// inspection is what `processor inspect` shows; its JSON is --json.
type inspection struct {
	App            string          `json:"app"`
	At             time.Time       `json:"at"`
	Group          groupview.Group `json:"group"`
	ChangelogTopic string          `json:"changelog_topic"`
	Tasks          []taskView      `json:"tasks"`
	Transactions   []txnView       `json:"transactions"`
	TxnPrefix      string          `json:"transactional_id_prefix"`
	Notes          []string        `json:"notes,omitempty"`
	inputs         []string        // the input topics, sorted
}

// taskView is one task: changelog partition Partition and input partition
// Partition of each input topic.
type taskView struct {
	Partition int32 `json:"partition"`
	// Epoch is the last committed epoch, 0 when the task has none;
	// MarkerOffset its marker's changelog offset (-1: none).
	Epoch        uint64      `json:"epoch"`
	MarkerOffset int64       `json:"marker_offset"`
	Inputs       []inputView `json:"inputs"`
	// Changelog offsets: Records is End − Start, what a restore from
	// scratch reads (compaction lowers it; End never moves back).
	ChangelogStart      int64 `json:"changelog_start"`
	ChangelogEnd        int64 `json:"changelog_end"`
	ChangelogLastStable int64 `json:"changelog_last_stable"`
	ChangelogRecords    int64 `json:"changelog_records"`
}

// inputView is one input partition of a task.
type inputView struct {
	Topic string `json:"topic"`
	// Marker is the next offset to read as the task's last marker says,
	// Committed as the group's committed offset says (-1: none).
	Marker    int64 `json:"marker"`
	Committed int64 `json:"committed"`
	End       int64 `json:"end"`
	// Lag is End − Committed, or End − the partition's start when the
	// group has committed nothing (a new app reads from the earliest).
	Lag int64 `json:"lag"`
}

// txnView is one open transaction of the app's transactional ids.
type txnView struct {
	ID         string    `json:"transactional_id"`
	State      string    `json:"state"`
	ProducerID int64     `json:"producer_id"`
	Epoch      int16     `json:"producer_epoch"`
	Started    time.Time `json:"started"`
	AgeMs      int64     `json:"age_ms"`
	TimeoutMs  int64     `json:"timeout_ms"`
	// Hanging: open for longer than its timeout. The coordinator should
	// have aborted it by then; until something does, every read_committed
	// reader of its partitions is held back at its first record.
	Hanging    bool     `json:"hanging"`
	Partitions []string `json:"partitions"`
}

func (x txnView) age() time.Duration     { return time.Duration(x.AgeMs) * time.Millisecond }
func (x txnView) timeout() time.Duration { return time.Duration(x.TimeoutMs) * time.Millisecond }

// openStates are the transaction states in which the transaction holds
// back the last stable offset of its partitions.
var openStates = []string{"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}

// hanging reports whether an open transaction has outlived its timeout.
func hanging(state string, age, timeout time.Duration) bool {
	return slices.Contains(openStates, state) && timeout > 0 && age > timeout
}

// inspect reads everything from Kafka; it writes nothing and joins no
// group. Each part is read at a slightly different moment: an app that is
// running moves on between them.
func inspect(ctx context.Context, cl *kgo.Client, opts []kgo.Opt, app string, now time.Time) (*inspection, error) {
	adm := kadm.NewClient(cl)
	in := &inspection{App: app, At: now.UTC(), ChangelogTopic: changelog.TopicName(app), TxnPrefix: app + "-", Tasks: []taskView{}, Transactions: []txnView{}}
	g, err := groupview.Describe(ctx, cl, adm, app)
	if err != nil {
		return nil, err
	}
	in.Group = g

	partitions, err := changelogPartitions(ctx, adm, in.ChangelogTopic)
	if errors.Is(err, errNoChangelog) {
		in.Notes = append(in.Notes, fmt.Sprintf("no changelog topic %s: the app has not run, or was reset", in.ChangelogTopic))
		partitions = 0
	} else if err != nil {
		return nil, err
	}
	committed, err := adm.FetchOffsets(ctx, app)
	if err != nil && !errors.Is(err, kerr.GroupIDNotFound) {
		return nil, fmt.Errorf("committed offsets of group %s: %w", app, err)
	}
	if partitions > 0 {
		if err := in.readTasks(ctx, adm, opts, partitions, committed); err != nil {
			return nil, err
		}
	}
	txns, err := openTransactions(ctx, adm, in.TxnPrefix, now)
	if err != nil {
		return nil, err
	}
	in.Transactions = txns
	return in, nil
}

func (in *inspection) readTasks(ctx context.Context, adm *kadm.Client, opts []kgo.Opt, partitions int32, committed kadm.OffsetResponses) error {
	topic := in.ChangelogTopic
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return fmt.Errorf("start offsets of %s: %w", topic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	// The input topics are those the markers name and those the group
	// committed: an app that has not yet committed an epoch has neither.
	inputs := map[string]bool{}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At >= 0 {
			inputs[o.Topic] = true
		}
	})
	marks := make([]map[string]int64, partitions)
	for p := range partitions {
		c, err := changelog.LastMarker(ctx, adm, opts, topic, p)
		if err != nil {
			return fmt.Errorf("task %d: %w", p, err)
		}
		t := taskView{Partition: p, MarkerOffset: c.Offset, ChangelogLastStable: c.LastStable, Inputs: []inputView{}}
		if s, ok := starts.Lookup(topic, p); ok {
			t.ChangelogStart = s.Offset
		}
		if e, ok := ends.Lookup(topic, p); ok {
			t.ChangelogEnd = e.Offset
		}
		t.ChangelogRecords = t.ChangelogEnd - t.ChangelogStart
		if c.Marker != nil {
			t.Epoch, marks[p] = c.Marker.Epoch, c.Marker.Offsets
			for name := range c.Marker.Offsets {
				inputs[name] = true
			}
		}
		in.Tasks = append(in.Tasks, t)
	}
	in.inputs = slices.Sorted(maps.Keys(inputs))
	for i := range in.Tasks {
		in.Tasks[i].Inputs = in.inputRows(marks[i], in.Tasks[i].Partition, committed)
	}
	return in.readInputEnds(ctx, adm)
}

// inputRows are a task's input partitions, without their ends yet.
func (in *inspection) inputRows(marks map[string]int64, p int32, committed kadm.OffsetResponses) []inputView {
	rows := make([]inputView, 0, len(in.inputs))
	for _, name := range in.inputs {
		row := inputView{Topic: name, Marker: -1, Committed: -1}
		if m, ok := marks[name]; ok {
			row.Marker = m
		}
		if o, ok := committed.Lookup(name, p); ok && o.Err == nil && o.At >= 0 {
			row.Committed = o.At
		}
		rows = append(rows, row)
	}
	return rows
}

// readInputEnds fills in each input partition's end and lag.
func (in *inspection) readInputEnds(ctx context.Context, adm *kadm.Client) error {
	if len(in.inputs) == 0 {
		return nil
	}
	ends, err := adm.ListEndOffsets(ctx, in.inputs...)
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", strings.Join(in.inputs, ","), err)
	}
	starts, err := adm.ListStartOffsets(ctx, in.inputs...)
	if err != nil {
		return fmt.Errorf("start offsets of %s: %w", strings.Join(in.inputs, ","), err)
	}
	for i := range in.Tasks {
		t := &in.Tasks[i]
		for j := range t.Inputs {
			row := &t.Inputs[j]
			e, ok := ends.Lookup(row.Topic, t.Partition)
			if !ok || e.Err != nil {
				in.Notes = append(in.Notes, fmt.Sprintf("input %s has no partition %d", row.Topic, t.Partition))
				row.End = -1
				continue
			}
			row.End = e.Offset
			from := row.Committed
			if from < 0 {
				if s, ok := starts.Lookup(row.Topic, t.Partition); ok && s.Err == nil {
					from = s.Offset
				}
			}
			row.Lag = max(0, row.End-max(from, 0))
		}
	}
	return nil
}

// openTransactions lists the open transactions whose transactional id
// starts with prefix: the app's instances' ids are <app>-<instance id>. An
// app whose id is a prefix of another's (orders, orders-v2) sees the
// other's too.
func openTransactions(ctx context.Context, adm *kadm.Client, prefix string, now time.Time) ([]txnView, error) {
	listed, err := adm.ListTransactions(ctx, nil, openStates)
	if err != nil {
		return nil, fmt.Errorf("list transactions: %w", err)
	}
	var ids []string
	for id := range listed {
		if strings.HasPrefix(id, prefix) {
			ids = append(ids, id)
		}
	}
	out := []txnView{}
	if len(ids) == 0 {
		return out, nil
	}
	described, err := adm.DescribeTransactions(ctx, ids...)
	if err != nil {
		return nil, fmt.Errorf("describe transactions: %w", err)
	}
	for _, d := range described.Sorted() {
		if d.Err != nil {
			return nil, fmt.Errorf("describe transaction %s: %w", d.TxnID, d.Err)
		}
		if !slices.Contains(openStates, d.State) {
			continue // ended between the list and the describe
		}
		v := txnView{ID: d.TxnID, State: d.State, ProducerID: d.ProducerID, Epoch: d.ProducerEpoch,
			TimeoutMs: int64(d.TimeoutMillis), Partitions: []string{}}
		if d.StartTimestamp > 0 {
			v.Started = time.UnixMilli(d.StartTimestamp).UTC()
			v.AgeMs = max(0, now.Sub(v.Started).Milliseconds())
		}
		v.Hanging = hanging(v.State, v.age(), v.timeout())
		d.Topics.Each(func(t string, p int32) { v.Partitions = append(v.Partitions, fmt.Sprintf("%s/%d", t, p)) })
		slices.Sort(v.Partitions)
		out = append(out, v)
	}
	return out, nil
}

// print writes the inspection as tables.
func (in *inspection) print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "app %s at %s\n\n", in.App, in.At.Format(time.RFC3339))
	g := in.Group
	if g.State == "Dead" {
		fmt.Fprintf(tw, "group %s: none (no committed offsets, no members)\n", in.App)
	} else {
		assignor := ""
		if g.Assignor != "" {
			assignor = ", assignor " + g.Assignor
		}
		fmt.Fprintf(tw, "group %s: %s, %s protocol, %s%s\n", in.App, g.State, g.Protocol, count(len(g.Members), "member"), assignor)
	}
	if len(g.Members) > 0 && g.Assignor == groupview.StandbyAssignor {
		// Standby replicas: the tasks each member keeps a copy of, and
		// the warm-ups among them (tasks waiting to move to it).
		fmt.Fprintln(tw, "  INSTANCE\tHOST\tCLIENT\tRACK\tASSIGNED\tSTANDBY TASKS\tWARMING UP\tMEMBER")
		for _, m := range g.Members {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(m.InstanceID), dash(m.Host), dash(m.ClientID), dash(m.Rack), assigned(m.Assigned), tasksList(m.Standby), tasksList(m.Warmup), m.MemberID)
		}
	} else if len(g.Members) > 0 {
		fmt.Fprintln(tw, "  INSTANCE\tHOST\tCLIENT\tASSIGNED\tMEMBER")
		for _, m := range g.Members {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", dash(m.InstanceID), dash(m.Host), dash(m.ClientID), assigned(m.Assigned), m.MemberID)
		}
	}
	fmt.Fprintln(tw)
	if len(in.Tasks) > 0 {
		fmt.Fprintf(tw, "tasks (changelog %s, %d partitions)\n", in.ChangelogTopic, len(in.Tasks))
		fmt.Fprintln(tw, "  TASK\tEPOCH\tINPUT\tMARKER\tCOMMITTED\tEND\tLAG\tCHANGELOG RECORDS\tOPEN TXN")
		for _, t := range in.Tasks {
			epoch := "-"
			if t.MarkerOffset >= 0 {
				epoch = fmt.Sprint(t.Epoch)
			}
			open := ""
			if t.ChangelogLastStable < t.ChangelogEnd {
				open = "yes"
			}
			rows := t.Inputs
			if len(rows) == 0 {
				rows = []inputView{{Topic: "-", Marker: -1, Committed: -1, End: -1, Lag: -1}}
			}
			for _, r := range rows {
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", t.Partition, epoch, r.Topic, offset(r.Marker), offset(r.Committed), offset(r.End), offset(r.Lag), t.ChangelogRecords, open)
			}
		}
		fmt.Fprintln(tw)
	}
	hangingCount := 0
	for _, x := range in.Transactions {
		if x.Hanging {
			hangingCount++
		}
	}
	fmt.Fprintf(tw, "open transactions of %s*: %d", in.TxnPrefix, len(in.Transactions))
	if hangingCount > 0 {
		fmt.Fprintf(tw, ", %d HANGING (older than their timeout)", hangingCount)
	}
	fmt.Fprintln(tw)
	if len(in.Transactions) > 0 {
		fmt.Fprintln(tw, "  TRANSACTIONAL ID\tSTATE\tAGE\tTIMEOUT\tPRODUCER\tPARTITIONS\t")
		for _, x := range in.Transactions {
			flag := ""
			if x.Hanging {
				flag = "HANGING"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", x.ID, x.State, x.age(), x.timeout(), x.ProducerID, x.Epoch, strings.Join(x.Partitions, ","), flag)
		}
	}
	for _, n := range in.Notes {
		fmt.Fprintf(tw, "\nnote: %s\n", n)
	}
	return tw.Flush()
}

func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func offset(o int64) string {
	if o < 0 {
		return "-"
	}
	return fmt.Sprint(o)
}

// tasksList is "0,3,5" (tasks, or a topic's partitions), or "-" for none.
func tasksList(ts []int32) string {
	if len(ts) == 0 {
		return "-"
	}
	ps := make([]string, len(ts))
	for i, p := range ts {
		ps[i] = fmt.Sprint(p)
	}
	return strings.Join(ps, ",")
}

func assigned(a map[string][]int32) string {
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(a)) {
		parts = append(parts, t+":"+tasksList(a[t]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
