// Command processor runs a Sluice processor instance with a built-in job,
// configured by SLUICE_* environment variables (see the README's
// configuration reference).
//
//	processor [run]    run the job named by SLUICE_JOB (the default)
//	processor demo     run a real job on an embedded broker, crash it, check it
//	processor generate write integer input for the aggregate job
//	processor savepoint copy the app's state from its changelog to SLUICE_SAVEPOINT_DIR
//	processor inspect  show the app's group, tasks (epochs, lag) and open transactions
//	processor reset    delete the app's group, internal topics and state dir (--yes)
//	processor broker   run an embedded single-node Kafka (kfake) for trying things out
//	processor healthz  exit 0 if the local processor's /healthz (--ready: /readyz) answers 200
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/barrier"
	"github.com/sluicehq/sluice/function"
	"github.com/sluicehq/sluice/internal/gctune"
	"github.com/sluicehq/sluice/jobs"
	// s3:// savepoint locations (SLUICE_SAVEPOINT_DIR,
	// SLUICE_RESTORE_FROM); gs:// ones come with gcs.go.
	_ "github.com/sluicehq/sluice/savepoint/s3"
)

const usage = `usage: processor [command]

commands:
  run        run the job named by SLUICE_JOB (default when no command is given)
  demo       start an embedded broker, run two instances of the aggregate job,
             kill one mid-run, restart it, and check the output exactly once
             (flags: -keep keeps it running; -inputs N; -partitions N; -rate N)
  generate   write base-10 integers to SLUICE_GENERATE_TOPIC at SLUICE_GENERATE_RATE
  savepoint  copy the state of SLUICE_APP_ID from its changelog (each task at
             its last committed epoch) to a new savepoint under
             SLUICE_SAVEPOINT_DIR (a path, file://, s3:// or gs:// URL), and print
             its location (for SLUICE_RESTORE_FROM) last; --stop first stops
             the app (every instance takes a final checkpoint and leaves the
             group), so the savepoint is exactly where it stopped; --drain
             (with --stop) first waits until every input record is
             committed; --timeout (default 5m). A pipeline (wordcount)
             needs --stop, and --drain unless its hops are idle;
             --one-job: the app is one job although topics are named like
             a pipeline's stages (another app's)
  resume     let a stopped app run again (its waiting instances join)
  inspect    show SLUICE_APP_ID as Kafka sees it, no instance needed: the
             group and its members; per task the last committed epoch, its
             marker offsets, the group's committed offsets, input end and
             lag, changelog size; open transactions of <app>-* with their age
             (hanging: older than their timeout) (flag: --json)
  reset      delete the group SLUICE_APP_ID, its internal topics (changelog,
             control, repartition) and SLUICE_STATE_DIR/<app>; prints what it
             would delete unless --yes; refuses while the group has members;
             output and DLQ topics are kept
  broker     run an embedded single-node Kafka-protocol broker (kfake);
             flags: -addr host:port (default 127.0.0.1:9092),
             -topics name:partitions[,...] to create topics at start
  healthz    health check for containers without a shell: GET /healthz (with
             --ready: /readyz) on 127.0.0.1 at SLUICE_METRICS_ADDR's port;
             exit 0 on 200, 1 otherwise (flag: --timeout, default 2s)
  help       show this text

Configuration is by environment variables only; every SLUICE_* variable is
listed with its default in the README's "Configuration reference".
A bad or missing variable exits with status 2 and one line naming it.
`

// builtins are the jobs SLUICE_JOB can name, built from the configuration
// (thresholds and windows are job parameters).
var builtins = map[string]func(Config) sluice.Job{
	"aggregate": func(c Config) sluice.Job {
		return jobs.AggregateWith(jobs.AggregateOptions{Emit: c.Sink == "" || c.OutputTopic != "", Rows: c.Sink != ""})
	},
	"echo": func(c Config) sluice.Job {
		return jobs.EchoWith(jobs.EchoOptions{Emit: c.Sink == "" || c.OutputTopic != "", Rows: c.Sink != ""})
	},
	"temperature-alert": func(c Config) sluice.Job { return jobs.TemperatureAlert(c.AlertThreshold) },
	"temperature-split": func(Config) sluice.Job { return jobs.TemperatureSplit() },
	"rising-temperature": func(c Config) sluice.Job {
		return jobs.RisingTemperature(jobs.RisingOptions{Window: c.RisingWindow, EventTime: c.TimeDomain == "event", LateOutput: c.SideOutputTopic != ""})
	},
	"window-average": func(c Config) sluice.Job {
		return jobs.WindowAverage(jobs.WindowAverageOptions{Window: c.Window, LateOutput: c.SideOutputTopic != ""})
	},
}

// pipelines are the built-in jobs of several stages (sluice.NewPipeline).
var pipelines = map[string]func(Config) []sluice.Stage{
	"wordcount": func(Config) []sluice.Stage { return jobs.WordCount() },
}

// functionJob is SLUICE_JOB's value for sidecar mode: the job is the
// user's function at SLUICE_FUNCTION_URL, built from its Describe answer at
// start (see functionJob in serve), so it is not in builtins.
const functionJob = "function"

func jobSpecs() []JobSpec {
	specs := make([]JobSpec, 0, len(builtins)+len(pipelines)+1)
	for name := range pipelines {
		specs = append(specs, JobSpec{Name: name, Emits: true})
	}
	for name, mk := range builtins {
		j := mk(Config{})
		_, sink := sinkTables[name]
		specs = append(specs, JobSpec{Name: name, Emits: j.Emits, SideOutput: len(j.SideOutputs) > 0, Sink: sink})
	}
	// The function job emits; its side output is bound only if the
	// function declares one.
	return append(specs, JobSpec{Name: functionJob, Emits: true})
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runProcessor(environ())
	case "demo":
		return runDemo(args)
	case "generate":
		return runGenerate(environ())
	case "savepoint":
		return runSavepoint(environ(), args)
	case "resume":
		return runResume(environ())
	case "inspect":
		return runInspect(args, environ())
	case "reset":
		return runReset(args, environ())
	case "broker":
		return runBroker(args)
	case "healthz":
		return runHealthz(args, environ(), os.Stdout, os.Stderr)
	case "help", "-h", "-help", "--help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "processor: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}

func environ() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func configFail(err error) int {
	fmt.Fprintln(os.Stderr, "processor:", err)
	return 2
}

func newLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func runProcessor(envm map[string]string) int {
	cfg, err := loadConfig(envm, jobSpecs())
	if err == nil {
		err = cfg.validateRun()
	}
	var gc gctune.Setting
	if err == nil {
		// Before anything allocates much: the collector's setting for
		// the whole run (internal/gctune, docs/operations.md).
		gc, err = gctune.Apply(cfg.StateBackend)
	}
	if err != nil {
		return configFail(err)
	}
	log := newLogger(cfg.Level())
	cfg.gc = gc
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := serve(ctx, log, cfg); err != nil {
		if re := (*sluice.RestoreError)(nil); errors.As(err, &re) {
			// A savepoint that does not fit the job is a configuration
			// error: one line, like a bad variable.
			return configFail(fmt.Errorf("SLUICE_RESTORE_FROM: %s", re.Reason))
		}
		if ce := (*ConfigError)(nil); errors.As(err, &ce) {
			return configFail(err) // the function does not fit the configuration
		}
		log.Error("processor stopped", "err", err)
		return 1
	}
	return 0
}

// serve runs one instance and its HTTP endpoints until ctx ends.
func serve(ctx context.Context, log *slog.Logger, cfg Config) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	clientOpts, err := cfg.kafkaOpts()
	if err != nil {
		return err
	}
	opts := engineOptions(cfg, log, reg)
	opts.ClientOpts = clientOpts
	if opts.Sink != nil {
		defer opts.Sink.Close()
	}
	// The endpoints serve from the start: while a function is awaited
	// (bindFunction) the process is alive but not ready.
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("SLUICE_METRICS_ADDR=%s: %w", cfg.MetricsAddr, err)
	}
	var inst atomic.Pointer[runner]
	ready := func() bool { in := inst.Load(); return in != nil && (*in).Ready() }
	queries := &stateQueries{instance: cfg.InstanceID, peerURL: cfg.QueryPeerURL}
	srv := &http.Server{Handler: httpHandler(reg, ready, queries), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	if cfg.Job == functionJob {
		if err := bindFunction(ctx, cfg, &opts); err != nil {
			return err
		}
	}
	for _, w := range cfg.warnings() {
		log.Warn(w)
	}
	var in runner
	var jobs []queryable // the jobs whose states /state serves, each with its instance
	if stages, ok := pipelines[cfg.Job]; ok {
		ss := stages(cfg)
		var p *sluice.Pipeline
		if p, err = sluice.NewPipeline(opts, ss...); err == nil {
			in = p
			for _, s := range ss {
				jobs = append(jobs, queryable{p.Stage(s.Name), s.Job})
			}
		}
	} else {
		var i *sluice.Instance
		if i, err = sluice.New(opts); err == nil {
			in = i
			jobs = append(jobs, queryable{i, opts.Job})
		}
	}
	if err != nil {
		return err
	}
	queries.serve(jobs...)
	inst.Store(&in)
	log.Info("processor starting", append(append(cfg.Summary(), "metrics", ln.Addr().String()), cfg.gc.LogAttrs()...)...)
	err = in.Run(ctx)
	log.Info("processor stopped")
	if ae := (*sluice.AuthError)(nil); errors.As(err, &ae) {
		return fmt.Errorf("%w; the processor connects with %s", err, cfg.identity())
	}
	return err
}

// runner is what serve runs: an Instance, or a Pipeline of several.
type runner interface {
	Run(context.Context) error
	Ready() bool
}

// httpHandler serves /metrics, /healthz (the process is alive), /readyz
// (ready: see sluice.Instance.Ready) and the state queries, /state/{state}.
func httpHandler(reg *prometheus.Registry, ready func() bool, queries http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /state/{state}", queries)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "not ready: joining the group, restoring tasks, the brokers or the function (SLUICE_JOB=function) unreachable, or a topic the job writes to missing", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// tolerable maps SLUICE_TOLERABLE_FAILURES (and SLUICE_MAX_WARMUP_REPLICAS)
// onto the options, where 0 means the default and a negative count none.
func tolerable(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// bindFunction asks the function to describe itself (waiting while it does
// not answer yet) and makes it the job. A function whose declarations do not
// fit the configuration is a *ConfigError.
func bindFunction(ctx context.Context, cfg Config, opts *sluice.Options) error {
	fo := cfg.FunctionConfig.options()
	fo.AppID, fo.Logger, fo.Registry = cfg.AppID, opts.Logger, opts.Registry
	job, err := function.New(ctx, fo)
	if de := (*function.DescribeError)(nil); errors.As(err, &de) {
		return &ConfigError{Var: "SLUICE_FUNCTION_URL", Value: cfg.FunctionURL, Expected: "a function this processor can run: " + de.Reason}
	}
	if err != nil {
		return err
	}
	// The binary binds at most one side output, to SLUICE_SIDE_OUTPUT_TOPIC.
	// A job refused here is closed (its metrics off the registry), as a
	// job whose New failed is its caller's to close.
	var refused *ConfigError
	switch {
	case len(job.SideOutputs) > 1:
		refused = &ConfigError{Var: "SLUICE_FUNCTION_URL", Value: cfg.FunctionURL, Expected: fmt.Sprintf("a function with at most one side output (it declares %v; the processor binds one, to SLUICE_SIDE_OUTPUT_TOPIC)", job.SideOutputs)}
	case len(job.SideOutputs) == 1 && cfg.SideOutputTopic == "":
		refused = &ConfigError{Var: "SLUICE_SIDE_OUTPUT_TOPIC", Expected: fmt.Sprintf("a Kafka topic name (the function declares side output %q)", job.SideOutputs[0])}
	case len(job.SideOutputs) == 0 && cfg.SideOutputTopic != "":
		refused = &ConfigError{Var: "SLUICE_SIDE_OUTPUT_TOPIC", Value: cfg.SideOutputTopic, Expected: "unset: the function declares no side output"}
	}
	if refused != nil {
		_ = job.Close()
		return refused
	}
	opts.Job = job
	opts.SideOutputTopics = map[sluice.OutputTag]string{}
	for _, tag := range job.SideOutputs {
		opts.SideOutputTopics[tag] = cfg.SideOutputTopic
	}
	return nil
}

// maxTaskIdle is SLUICE_MAX_TASK_IDLE as the engine takes it: there 0 is
// the default and a negative value never holds records back.
func maxTaskIdle(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func engineOptions(cfg Config, log *slog.Logger, reg prometheus.Registerer) sluice.Options {
	var job sluice.Job // the function job is bound in serve (bindFunction)
	if mk, ok := builtins[cfg.Job]; ok {
		job = mk(cfg)
	}
	// The built-in jobs have at most one side output, bound to
	// SLUICE_SIDE_OUTPUT_TOPIC.
	side := map[sluice.OutputTag]string{}
	for _, tag := range job.SideOutputs {
		side[tag] = cfg.SideOutputTopic
	}
	return sluice.Options{
		SideOutputTopics:  side,
		MaxOutOfOrderness: cfg.MaxOutOfOrderness,
		IdleTimeout:       cfg.IdleTimeout,
		MaxTaskIdle:       maxTaskIdle(cfg.MaxTaskIdle),
		Brokers:           cfg.Brokers,
		AppID:             cfg.AppID,
		InstanceID:        cfg.InstanceID,
		Job:               job,
		InputTopics:       cfg.InputTopics,
		OutputTopic:       cfg.OutputTopic,
		DLQTopic:          cfg.DLQTopic(),
		StateDir:          cfg.StateDir,
		Backend:           cfg.StateBackend,
		Guarantee:         sluice.Guarantee(cfg.Guarantee),
		Checkpoint: barrier.Config{
			Interval:          cfg.CheckpointInterval,
			Timeout:           cfg.CheckpointTimeout(),
			MinPause:          cfg.MinPause,
			TolerableFailures: tolerable(cfg.TolerableFailures),
		},
		TransactionTimeout:    cfg.TransactionTimeout(),
		SessionTimeout:        cfg.SessionTimeout,
		RebalanceTimeout:      cfg.RebalanceTimeout(),
		GroupProtocol:         cfg.GroupProtocol,
		DisableTopicCreation:  !cfg.CreateTopics,
		StayInGroupOnShutdown: !cfg.LeaveOnShutdown,
		Partitions:            int32(cfg.Partitions),
		StateCleanupDelay:     cfg.StateCleanupDelay,
		EpochMaxKeys:          cfg.EpochMaxKeys,
		EpochMaxBytes:         cfg.EpochMaxBytes,
		Parallelism:           cfg.Parallelism,
		PipelinedEpochs:       cfg.PipelinedEpochs,
		RestoreConcurrency:    cfg.RestoreConcurrency,
		StandbyReplicas:       cfg.StandbyReplicas,
		MaxWarmupReplicas:     tolerable(cfg.MaxWarmupReplicas), // 0: none
		AcceptableRecoveryLag: cfg.AcceptableRecoveryLag,
		Rack:                  cfg.Rack,
		RestoreFrom:           cfg.RestoreFrom,
		AllowNonRestoredState: cfg.AllowNonRestoredState,
		Logger:                log,
		Registry:              reg,
		Sink:                  newSink(cfg, log),
	}
}
