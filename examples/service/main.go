// Command service embeds Sluice in an HTTP service: its own handler takes
// clicks (POST /clicks {"user":"ann","url":"/pricing"}) and produces them to
// Kafka, and a Sluice instance in the same process counts them per user,
// exactly once, into -output ({"user":"ann","clicks":3}). GET
// /clicks/{user} reads a user's committed count from the instance's state
// (Instance.Query).
//
// The two share one process and its operations:
//
//   - one Prometheus registry, served on /metrics: the service's
//     http_requests_total, the Go runtime's series and Sluice's sluice_*;
//   - /healthz (the process answers) and /readyz (the instance is in its
//     group with every task restored, and the service is not shutting down);
//   - one shutdown, in this order on SIGTERM: /readyz turns 503 and, after
//     -drain-delay, the HTTP server stops accepting connections and finishes
//     the requests in flight; then the instance's context is cancelled, and
//     Run returns after the final checkpoint; then the process exits.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/kstate"
)

// Click is what POST /clicks takes and the input topic carries.
type Click struct {
	User string `json:"user"`
	URL  string `json:"url"`
}

// Count is what the job emits, keyed by user.
type Count struct {
	User   string `json:"user"`
	Clicks int64  `json:"clicks"`
}

var clicks = kstate.Value("clicks", kstate.Int64())

// newJob counts clicks per user; the input is keyed by user.
func newJob() sluice.Job {
	return sluice.Job{
		Name:  "click-count",
		Emits: true,
		Process: func(ctx sluice.Context, rec *sluice.Record) error {
			n, _, err := clicks.Get(ctx)
			if err != nil {
				return err
			}
			n++
			if err := clicks.Set(ctx, n); err != nil {
				return err
			}
			out, err := json.Marshal(Count{User: string(rec.Key), Clicks: n})
			if err != nil {
				return err
			}
			ctx.Emit(rec.Key, out)
			return nil
		},
	}
}

// config is the command line.
type config struct {
	addr, brokers, app, instance, input, output, stateDir string
	drainDelay, shutdownTimeout                           time.Duration
}

// parseFlags parses the command line, and writes why it is wrong to stderr.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	host, _ := os.Hostname()
	var c config
	fs := flag.NewFlagSet("service", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", ":8080", "HTTP listen address")
	fs.StringVar(&c.brokers, "brokers", "localhost:9092", "seed broker, host:port")
	fs.StringVar(&c.app, "app", "clicks", "app id: consumer group, prefix of the internal topics")
	fs.StringVar(&c.instance, "instance", host, "stable id of this replica")
	fs.StringVar(&c.input, "input", "clicks", "topic POST /clicks produces to, keyed by user")
	fs.StringVar(&c.output, "output", "clicks-per-user", "topic of the running counts")
	fs.StringVar(&c.stateDir, "state-dir", "state", "local state directory")
	fs.DurationVar(&c.drainDelay, "drain-delay", 5*time.Second, "on SIGTERM, how long /readyz fails before the listener closes, so load balancers stop sending first")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long requests in flight get to finish")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if c.drainDelay < 0 || c.shutdownTimeout <= 0 {
		err := fmt.Errorf("-drain-delay %s, -shutdown-timeout %s: want >= 0 and > 0", c.drainDelay, c.shutdownTimeout)
		fmt.Fprintln(stderr, err)
		return config{}, err
	}
	return c, nil
}

// service is the HTTP side and the instance, sharing a registry.
type service struct {
	log      *slog.Logger
	reg      *prometheus.Registry
	inst     *sluice.Instance
	producer *kgo.Client
	input    string
	instance string      // -instance
	draining atomic.Bool // set first on shutdown: /readyz fails
}

// newService builds the registry, the producer and the instance. Nothing
// touches the network yet.
func newService(cfg config, log *slog.Logger) (*service, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	inst, err := sluice.New(sluice.Options{
		Brokers:     []string{cfg.brokers},
		AppID:       cfg.app,
		InstanceID:  cfg.instance,
		Job:         newJob(),
		InputTopics: []string{cfg.input},
		OutputTopic: cfg.output,
		StateDir:    cfg.stateDir,
		Logger:      log,
		Registry:    reg, // Sluice's series on the service's registry
	})
	if err != nil {
		return nil, err
	}
	// The handlers' producer is idempotent (franz-go's default) but not
	// transactional: a client that retries a POST whose answer it lost
	// sends the click twice. Exactly-once starts at the input topic.
	producer, err := kgo.NewClient(kgo.SeedBrokers(cfg.brokers), kgo.DefaultProduceTopic(cfg.input))
	if err != nil {
		return nil, err
	}
	return &service{log: log, reg: reg, inst: inst, producer: producer, input: cfg.input, instance: cfg.instance}, nil
}

// handler serves the service's own endpoint and the operational ones.
func (s *service) handler() http.Handler {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_requests_total", Help: "HTTP requests by handler and status code.",
	}, []string{"handler", "code"})
	s.reg.MustRegister(requests)
	count := func(name string, h http.HandlerFunc) http.Handler {
		return promhttp.InstrumentHandlerCounter(requests.MustCurryWith(prometheus.Labels{"handler": name}), h)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /clicks", count("clicks", s.postClick))
	mux.Handle("GET /clicks/{user}", count("count", s.getCount))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case s.draining.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !s.inst.Ready():
			http.Error(w, "not ready: joining the group or restoring state", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	return mux
}

func (s *service) postClick(w http.ResponseWriter, r *http.Request) {
	var c Click
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&c); err != nil || c.User == "" {
		http.Error(w, `want {"user":"…","url":"…"}`, http.StatusBadRequest)
		return
	}
	v, _ := json.Marshal(c)
	if err := s.producer.ProduceSync(r.Context(), &kgo.Record{Key: []byte(c.User), Value: v}).FirstErr(); err != nil {
		s.log.Warn("click not produced", "err", err)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// getCount answers a user's committed click count from the instance's
// state (Instance.Query): what the output has said, or will say once the
// epoch's apply is done, never a count an abort could take back. A user
// whose task runs on another replica is answered 421 with that replica's
// id, which the caller (or a router that knows where replicas listen)
// asks instead.
func (s *service) getCount(w http.ResponseWriter, r *http.Request) {
	user := r.PathValue("user")
	var n int64
	err := s.inst.Query([]byte(user), func(st kstate.Scope) error {
		var err error
		n, _, err = clicks.Get(st)
		return err
	})
	var nl *sluice.NotLocalError
	if errors.As(err, &nl) {
		owner, oerr := s.inst.QueryOwner(r.Context(), []byte(user))
		if nl.Restoring || oerr != nil || owner.InstanceID == "" || owner.InstanceID == s.instance {
			// Restoring here, or moving between replicas.
			w.Header().Set("Retry-After", "1")
			http.Error(w, "try again: the user's counter is restoring or moving between replicas", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMisdirectedRequest)
		json.NewEncoder(w).Encode(map[string]string{"owner": owner.InstanceID})
		return
	}
	if err != nil {
		s.log.Warn("count not read", "user", user, "err", err)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(Count{User: user, Clicks: n})
}

// run serves HTTP on ln and runs the instance until ctx ends or the
// instance stops by itself, then shuts both down in order.
func run(ctx context.Context, cfg config, ln net.Listener, log *slog.Logger) error {
	s, err := newService(cfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer s.producer.Close()
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	// The instance's context is its own, not ctx: SIGTERM must stop the
	// HTTP side first, while the instance keeps committing.
	instCtx, stopInstance := context.WithCancel(context.Background())
	defer stopInstance()
	stopped := make(chan error, 1)
	go func() { stopped <- s.inst.Run(instCtx) }()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-stopped: // refused for good: an ACL, credentials, topics
		stopped = nil
		log.Error("instance stopped", "err", runErr)
	case err := <-served:
		runErr = fmt.Errorf("http: %w", err)
	}

	// 1. Fail readiness, and give the load balancers time to notice.
	s.draining.Store(true)
	log.Info("shutdown: not ready")
	if cfg.drainDelay > 0 {
		time.Sleep(cfg.drainDelay)
	}
	// 2. Stop accepting connections; let the requests in flight finish,
	// so every click answered 202 has been produced.
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown: requests cut short", "err", err)
		srv.Close()
	}
	log.Info("shutdown: http stopped")
	// 3. Stop the instance: Run returns after the final checkpoint (and
	// leaving the group, so the partitions move at once).
	stopInstance()
	if stopped != nil {
		if err := <-stopped; err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	log.Info("shutdown: instance stopped")
	return runErr
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		os.Exit(2) // parseFlags said why
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		log.Error("listen", "addr", cfg.addr, "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, ln, log); err != nil {
		log.Error("service stopped", "err", err)
		os.Exit(1)
	}
}
