// Command fraud scores card transactions with per-card state. Each
// transaction (JSON, keyed by card number, its Kafka timestamp the time of the
// purchase) is emitted to -output with the reasons it looks suspicious, and
// the suspicious ones to -suspicious as well:
//
//	{"id":"tx-7","card":"4000-1","amount_cents":95000,"score":2,"reasons":["spend","outlier"]}
//
// The reasons, from the card's recent spending and its history:
//
//	velocity  more than -max-count transactions in -window
//	spend     more than -max-spend cents spent in -window
//	outlier   more than 10 times the card's average, once it has 5 transactions
//
// A card's state expires after -retention without a transaction.
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

// Transaction is the input.
type Transaction struct {
	ID          string `json:"id"`
	Card        string `json:"card"`
	AmountCents int64  `json:"amount_cents"`
	Merchant    string `json:"merchant,omitempty"`
}

// Scored is the output: the transaction and why it is suspicious.
type Scored struct {
	Transaction
	Score   int      `json:"score"`
	Reasons []string `json:"reasons"`
}

// spend is one transaction in a card's velocity window.
type spend struct {
	At    int64 `json:"at"` // unix milliseconds
	Cents int64 `json:"cents"`
}

// history is what the card has done since its state was created.
type history struct {
	Count      int64 `json:"count"`
	TotalCents int64 `json:"total_cents"`
}

// suspicious is the side output of the transactions with a reason.
const suspicious = sluice.OutputTag("suspicious")

// rules are the scoring thresholds.
type rules struct {
	window    time.Duration // velocity window
	maxCount  int           // transactions in the window before "velocity"
	maxSpend  int64         // cents spent in the window before "spend"
	retention time.Duration // a card's state lives this long after its last transaction
}

// outlierFactor and outlierHistory define "outlier": more than this many
// times the card's average, once it has this many transactions.
const (
	outlierFactor  = 10
	outlierHistory = 5
)

// newJob scores with r. Its state is declared here rather than as package
// variables because the TTL is a flag; the names are the state's identity in
// the changelog and must stay the same across releases.
func newJob(r rules) sluice.Job {
	ttl := kstate.WithTTL(r.retention, kstate.OnCreateAndWrite)
	recent := kstate.List("recent", kstate.JSON[spend](), ttl)
	past := kstate.Value("history", kstate.JSON[history](), ttl)

	return sluice.Job{
		Name:        "fraud",
		Emits:       true,
		SideOutputs: []sluice.OutputTag{suspicious},
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			var tx Transaction
			if err := json.Unmarshal(rec.Value, &tx); err != nil {
				return &sluice.DecodeError{Err: err}
			}
			if tx.Card != string(rec.Key) || tx.AmountCents <= 0 {
				return errors.New("want a positive amount_cents, keyed by its card") // dead-lettered
			}
			at := ctx.Timestamp()

			window, err := recent.Get(ctx)
			if err != nil {
				return err
			}
			kept := window[:0]
			var spent int64
			for _, s := range window {
				if s.At > at.Add(-r.window).UnixMilli() {
					kept = append(kept, s)
					spent += s.Cents
				}
			}
			kept = append(kept, spend{At: at.UnixMilli(), Cents: tx.AmountCents})
			spent += tx.AmountCents
			if err := recent.Update(ctx, kept); err != nil {
				return err
			}
			h, _, err := past.Get(ctx)
			if err != nil {
				return err
			}

			out := Scored{Transaction: tx, Reasons: []string{}}
			if len(kept) > r.maxCount {
				out.Reasons = append(out.Reasons, "velocity")
			}
			if spent > r.maxSpend {
				out.Reasons = append(out.Reasons, "spend")
			}
			if h.Count >= outlierHistory && tx.AmountCents > outlierFactor*h.TotalCents/h.Count {
				out.Reasons = append(out.Reasons, "outlier")
			}
			out.Score = len(out.Reasons)
			if err := past.Set(ctx, history{Count: h.Count + 1, TotalCents: h.TotalCents + tx.AmountCents}); err != nil {
				return err
			}

			b, err := json.Marshal(out)
			if err != nil {
				return err
			}
			// Both outputs join the epoch's transaction with the state:
			// a crash can neither lose an alert nor send it twice.
			ctx.Emit(rec.Key, b)
			if out.Score > 0 {
				ctx.Output(suspicious, rec.Key, b)
			}
			return nil
		},
	}
}

// config is the command line.
type config struct {
	brokers, app, instance, input, output, suspicious, stateDir string
	rules                                                       rules
}

// parseFlags parses the command line, and writes why it is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	host, _ := os.Hostname()
	var c config
	fs := flag.NewFlagSet("fraud", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.brokers, "brokers", "localhost:9092", "seed broker, host:port")
	fs.StringVar(&c.app, "app", "fraud", "app id: consumer group, prefix of the internal topics")
	fs.StringVar(&c.instance, "instance", host, "stable id of this replica")
	fs.StringVar(&c.input, "input", "card-transactions", "input topic, keyed by card")
	fs.StringVar(&c.output, "output", "scored-transactions", "topic of every transaction with its score")
	fs.StringVar(&c.suspicious, "suspicious", "suspicious-transactions", "topic of the transactions with a score above 0")
	fs.StringVar(&c.stateDir, "state-dir", "state", "local state directory")
	fs.DurationVar(&c.rules.window, "window", 10*time.Minute, "velocity window")
	fs.IntVar(&c.rules.maxCount, "max-count", 5, "transactions per card in the window before one is suspicious")
	fs.Int64Var(&c.rules.maxSpend, "max-spend", 200000, "cents per card in the window before a transaction is suspicious")
	fs.DurationVar(&c.rules.retention, "retention", 90*24*time.Hour, "how long a card's state lives after its last transaction")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var err error
	switch {
	case c.rules.window <= 0:
		err = fmt.Errorf("-window %s: want a positive duration", c.rules.window)
	case c.rules.maxCount < 1:
		err = fmt.Errorf("-max-count %d: want at least 1", c.rules.maxCount)
	case c.rules.maxSpend < 1:
		err = fmt.Errorf("-max-spend %d: want at least 1", c.rules.maxSpend)
	case c.rules.retention < c.rules.window:
		err = fmt.Errorf("-retention %s: want at least -window (%s)", c.rules.retention, c.rules.window)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return config{}, err
	}
	return c, nil
}

// options are the instance's options: what the command line says, the
// library's defaults for the rest.
func (c config) options(log *slog.Logger) sluice.Options {
	return sluice.Options{
		Brokers:          []string{c.brokers},
		AppID:            c.app,
		InstanceID:       c.instance,
		Job:              newJob(c.rules),
		InputTopics:      []string{c.input},
		OutputTopic:      c.output,
		SideOutputTopics: map[sluice.OutputTag]string{suspicious: c.suspicious},
		StateDir:         c.stateDir,
		Logger:           log,
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
		log.Error("fraud stopped", "err", err)
		os.Exit(1)
	}
}
