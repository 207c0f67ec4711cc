package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

type View struct {
	URL string `json:"url"`
}

// Keyed state: declared once, scoped to each record's key by the runtime.
// The names are the state's identity in bbolt and the changelog: keep them
// stable across releases.
var (
	views    = kstate.Value("views", kstate.Int64())
	lastView = kstate.Value("last-view", kstate.JSON[View]())
)

func countViews(ctx sluice.Context, rec *sluice.Record) error {
	var v View
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		return &sluice.DecodeError{Err: err} // dead-lettered, sluice.stage=decode
	}
	if v.URL == "" {
		return errors.New("view without url") // dead-lettered, sluice.stage=process
	}
	n, _, err := views.Get(ctx)
	if err != nil {
		return sluice.Fatal(err) // stops the instance; the open epoch aborts
	}
	if err := views.Set(ctx, n+1); err != nil {
		return err
	}
	if err := lastView.Set(ctx, v); err != nil {
		return err
	}
	out, err := json.Marshal(map[string]any{"views": n + 1, "last": v.URL})
	if err != nil {
		return err
	}
	ctx.Emit(rec.Key, out) // into the epoch's transaction, partitioned by key
	return nil
}

func main() {
	reg := prometheus.NewRegistry() // serve it with promhttp.HandlerFor
	inst, err := sluice.New(sluice.Options{
		Brokers:     []string{"localhost:9092"},
		AppID:       "views",   // group id; prefix of views-changelog, views-dlq
		InstanceID:  "views-1", // stable per replica
		Job:         sluice.Job{Name: "views", Emits: true, Process: countViews},
		InputTopics: []string{"page-views"},
		OutputTopic: "views-per-user",
		StateDir:    "/var/lib/views",
		// Everything else has the processor binary's defaults: exactly-once,
		// 100ms epochs, derived transaction, checkpoint, session and
		// rebalance timeouts, missing topics created.
		Logger:   slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		Registry: reg,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Run returns nil after a final checkpoint once ctx ends.
	if err := inst.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
