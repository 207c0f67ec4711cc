// Command sessions turns users' activity into sessions: a user's session is
// their events with no gap longer than -gap between them, in event time (the
// records' Kafka timestamps). When the watermark passes the last event plus
// the gap, the session closes and one summary is emitted, keyed by user:
//
//	{"user":"ann","events":3,"start":"…","end":"…","span_seconds":240}
//
// An event whose session would already have closed (its time plus the gap is
// at or behind the watermark) goes to the late topic, unchanged.
//
// Usage:
//
//	sessions -brokers localhost:9092 -input page-views -output sessions -gap 30m
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// session is the open session of the record's user. The name is the state's
// identity in the changelog: keep it stable.
var session = kstate.Value("session", kstate.JSON[openSession]())

type openSession struct {
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"` // the latest event so far
	Events int64     `json:"events"`
}

// Summary is what the job emits when a session closes.
type Summary struct {
	User        string    `json:"user"`
	Events      int64     `json:"events"`
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	SpanSeconds float64   `json:"span_seconds"`
}

// late is the side output of events that came after their session closed.
const late = sluice.OutputTag("late")

// newJob sessionizes with the given inactivity gap. Input records must be
// keyed by user: state and timers belong to the record key.
func newJob(gap time.Duration) sluice.Job {
	return sluice.Job{
		Name:        "sessions",
		Emits:       true,
		SideOutputs: []sluice.OutputTag{late},
		EventTime:   true,
		// The producer's create time, which is when the user acted.
		Timestamp: sluice.KafkaTime,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			if len(rec.Key) == 0 {
				return errors.New("event without a user key") // dead-lettered
			}
			at := ctx.Timestamp()
			if !at.Add(gap).After(ctx.CurrentWatermark()) {
				ctx.Output(late, rec.Key, rec.Value, rec.Headers...)
				return nil
			}
			s, open, err := session.Get(ctx)
			if err != nil {
				return err
			}
			if !open {
				s = openSession{Start: at, End: at}
			} else {
				// One open session per user: an out-of-order event
				// joins it even when it lies more than the gap before
				// its start (Flink would keep two windows).
				ctx.Timers().DeleteEventTime(s.End.Add(gap))
				s.Start = minTime(s.Start, at)
				s.End = maxTime(s.End, at)
			}
			s.Events++
			ctx.Timers().RegisterEventTime(s.End.Add(gap))
			return session.Set(ctx, s)
		},
		OnTimer: func(ctx sluice.Context, _ sluice.Timer) error {
			s, open, err := session.Get(ctx)
			if err != nil || !open {
				return err
			}
			out, err := json.Marshal(Summary{
				User:        string(ctx.Key()),
				Events:      s.Events,
				Start:       s.Start.UTC(),
				End:         s.End.UTC(),
				SpanSeconds: s.End.Sub(s.Start).Seconds(),
			})
			if err != nil {
				return err
			}
			ctx.Emit(ctx.Key(), out)
			return session.Clear(ctx)
		},
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// config is the command line.
type config struct {
	brokers, app, instance, input, output, lateTopic, stateDir string
	gap, outOfOrder                                            time.Duration
}

// parseFlags parses the command line, and writes why it is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	host, _ := os.Hostname()
	var c config
	fs := flag.NewFlagSet("sessions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.brokers, "brokers", "localhost:9092", "seed broker, host:port")
	fs.StringVar(&c.app, "app", "sessions", "app id: consumer group, prefix of the internal topics")
	fs.StringVar(&c.instance, "instance", host, "stable id of this replica")
	fs.StringVar(&c.input, "input", "page-views", "input topic, keyed by user")
	fs.StringVar(&c.output, "output", "sessions", "topic of the closed sessions")
	fs.StringVar(&c.lateTopic, "late", "sessions-late", "topic of the events that came after their session closed")
	fs.StringVar(&c.stateDir, "state-dir", "state", "local state directory")
	fs.DurationVar(&c.gap, "gap", 30*time.Minute, "inactivity that closes a session")
	fs.DurationVar(&c.outOfOrder, "out-of-orderness", time.Minute, "how far out of order events may come without being late")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if c.gap <= 0 {
		err := fmt.Errorf("-gap %s: want a positive duration", c.gap)
		fmt.Fprintln(fs.Output(), err)
		return config{}, err
	}
	return c, nil
}

// options are the instance's options: what the command line says, the
// library's defaults for the rest.
func (c config) options(log *slog.Logger) sluice.Options {
	return sluice.Options{
		Brokers:           []string{c.brokers},
		AppID:             c.app,
		InstanceID:        c.instance,
		Job:               newJob(c.gap),
		InputTopics:       []string{c.input},
		OutputTopic:       c.output,
		SideOutputTopics:  map[sluice.OutputTag]string{late: c.lateTopic},
		StateDir:          c.stateDir,
		MaxOutOfOrderness: c.outOfOrder,
		Logger:            log,
	}
}

// run runs the job until ctx ends, then returns after the final checkpoint.
func run(ctx context.Context, opts sluice.Options) error {
	inst, err := sluice.New(opts)
	if err != nil {
		return err
	}
	return inst.Run(ctx)
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2) // parseFlags said why
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg.options(log)); err != nil {
		log.Error("sessions stopped", "err", err)
		os.Exit(1)
	}
}
