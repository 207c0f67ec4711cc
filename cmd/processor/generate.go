package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// runGenerate writes base-10 integers keyed by "key-N" to a topic at a
// steady rate until SIGTERM: input for the aggregate job.
func runGenerate(envm map[string]string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return generate(ctx, envm)
}

// generate is runGenerate until ctx ends.
func generate(ctx context.Context, envm map[string]string) int {
	cfg, err := loadGenerateConfig(envm)
	if err != nil {
		return configFail(err)
	}
	log := newLogger(0)
	opts, err := cfg.kafkaOpts()
	if err != nil {
		log.Error("generate", "err", err)
		return 1
	}
	for _, w := range cfg.warnings() {
		log.Warn(w)
	}
	cl, err := kgo.NewClient(append(opts, kgo.SeedBrokers(cfg.Brokers...), kgo.AllowAutoTopicCreation())...)
	if err != nil {
		log.Error("generate", "err", err)
		return 1
	}
	defer cl.Close()
	// /healthz while the process runs; /readyz once a produce succeeded,
	// which says the brokers are reachable and the topic exists.
	var produced atomic.Bool
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		log.Error("generate", "err", fmt.Errorf("SLUICE_METRICS_ADDR=%s: %w", cfg.MetricsAddr, err))
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !produced.Load() {
			http.Error(w, "not ready: no record produced yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	perTick := max(1, cfg.Rate/10)
	var sent int64
	for {
		select {
		case <-ctx.Done():
			cl.Flush(context.Background())
			log.Info("generate stopped", "records", sent)
			return 0
		case <-tick.C:
		}
		for range perTick {
			key := fmt.Sprintf("key-%d", rng.IntN(cfg.Keys))
			val := strconv.Itoa(rng.IntN(2001) - 1000)
			cl.Produce(ctx, &kgo.Record{Topic: cfg.Topic, Key: []byte(key), Value: []byte(val)}, func(_ *kgo.Record, err error) {
				if err != nil && ctx.Err() == nil {
					log.Warn("generate: produce failed", "err", err)
				}
				if err == nil {
					produced.Store(true)
				}
			})
			sent++
		}
	}
}
