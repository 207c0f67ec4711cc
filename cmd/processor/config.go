package main

// Configuration of the processor binary. Every variable is a field of Config
// (or of GenerateConfig for `processor generate`, SavepointConfig for
// `processor savepoint`), read with caarlos0/env from
// an explicit map so tests never touch the process environment. The struct
// tags are the single source of the README's configuration reference:
//
//	env         name and env options (required, notEmpty)
//	envDefault  literal default, shown in backticks in the README
//	docDefault  default shown when it is derived or conditional
//	desc        the README's "Meaning" column (no '|')
//	expect      the accepted form, used in "expected ..." errors; durations,
//	            integers, floats and bools have a built-in one
//	secret      "true": never logged by Summary nor echoed in errors
//
// readme_test.go fails when README.md drifts from these tags.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/function"
	"github.com/sluicehq/sluice/internal/gctune"
	"github.com/sluicehq/sluice/savepoint"
)

// Config is the environment of `processor` (run, demo). Fields named Raw…
// hold a variable as given, 0 or "" meaning derived: use the method of the
// same name without Raw for the value in effect.
type Config struct {
	Brokers               []string      `env:"SLUICE_BROKERS" docDefault:"required for run, generate, savepoint, inspect and reset" expect:"comma-separated seed brokers such as kafka:9092" desc:"Comma-separated seed brokers (host:port)."`
	AppID                 string        `env:"SLUICE_APP_ID,required,notEmpty" expect:"1 to 200 of the characters a-z A-Z 0-9 . _ -" desc:"Consumer group id; prefix of the transactional id and of the internal topics (changelog, DLQ). Letters, digits, '.', '_', '-'; at most 200 characters."`
	Job                   string        `env:"SLUICE_JOB" docDefault:"required" desc:"Built-in job to run: aggregate, echo, temperature-alert, temperature-split, rising-temperature, window-average or wordcount (two stages: see docs/topology.md); or function, a user's function in any language beside the processor (SLUICE_FUNCTION_*, docs/sidecar.md)."`
	InputTopics           []string      `env:"SLUICE_INPUT_TOPICS,required,notEmpty" expect:"comma-separated Kafka topic names" desc:"Input topics. Several must be co-partitioned (equal partition counts; others stop the instance at start): a task then owns partition p of each, processes their records in timestamp order and shares one keyed state (docs/topology.md). The built-in jobs read one."`
	OutputTopic           string        `env:"SLUICE_OUTPUT_TOPIC" docDefault:"required by jobs that emit" expect:"a Kafka topic name" desc:"Topic the job writes its results to."`
	StateDir              string        `env:"SLUICE_STATE_DIR" envDefault:"./state" expect:"a directory path" desc:"Local state directory: one bbolt file per task. Kept across restarts; the container image sets /var/lib/sluice (a volume)."`
	StateBackend          string        `env:"SLUICE_STATE_BACKEND" envDefault:"bbolt" desc:"State backend: bbolt (on disk, survives restarts) or memory (rebuilt from the changelog at every start)."`
	Guarantee             string        `env:"SLUICE_GUARANTEE" envDefault:"exactly_once" desc:"exactly_once (one Kafka transaction per epoch; read output with isolation.level=read_committed) or at_least_once (idempotent producer, no transaction)."`
	CheckpointInterval    time.Duration `env:"SLUICE_CHECKPOINT_INTERVAL" envDefault:"100ms" desc:"Epoch length: how often state, outputs and offsets are committed. Shorter lowers end-to-end latency of read_committed readers; longer raises throughput. Must be > 0."`
	RawCheckpointTimeout  time.Duration `env:"SLUICE_CHECKPOINT_TIMEOUT" docDefault:"SLUICE_TRANSACTION_TIMEOUT minus the epoch" desc:"How long one checkpoint (flush and commit) may take before it counts as failed; it also bounds each call of the PostgreSQL sink, a restore's included. The derived value ends the checkpoint before the broker would abort its transaction. Must be greater than SLUICE_CHECKPOINT_INTERVAL when set."`
	MinPause              time.Duration `env:"SLUICE_MIN_PAUSE" envDefault:"0s" desc:"Least time between the end of one checkpoint and the start of the next, so slow commits cannot starve processing. 0 = none."`
	TolerableFailures     int           `env:"SLUICE_TOLERABLE_FAILURES" envDefault:"3" desc:"Consecutive failed checkpoints tolerated (each aborts the epoch and rewinds). One more restarts the instance's Kafka session from its local state, as Flink restarts a job from its last checkpoint. Must be >= 0."`
	RawTransactionTimeout time.Duration `env:"SLUICE_TRANSACTION_TIMEOUT" docDefault:"max(10s, 10 × epoch), where epoch = the longer of SLUICE_CHECKPOINT_INTERVAL and SLUICE_MIN_PAUSE" desc:"Kafka transaction timeout. When set it must be at least 2 × the epoch; at startup it is also checked against the broker's transaction.max.timeout.ms."`
	InstanceID            string        `env:"SLUICE_INSTANCE_ID" docDefault:"the hostname" expect:"1 to 249 of the characters a-z A-Z 0-9 . _ -" desc:"Stable identity of this instance: static group membership (group.instance.id) and the transactional id. Give every replica its own, and keep it across restarts."`
	SessionTimeout        time.Duration `env:"SLUICE_SESSION_TIMEOUT" envDefault:"45s" desc:"Consumer group session timeout: how long a silent member keeps its partitions. Must be >= 1s and within the broker's group.min/max.session.timeout.ms. With SLUICE_GROUP_PROTOCOL=consumer it is set at startup as the group's consumer.session.timeout.ms, which Kafka bounds by group.consumer.min/max.session.timeout.ms (45s to 60s by default); outside them the broker's value applies and a warning is logged."`
	RawRebalanceTimeout   time.Duration `env:"SLUICE_REBALANCE_TIMEOUT" docDefault:"2/3 of SLUICE_SESSION_TIMEOUT, at least 1s" desc:"How long members get to rejoin a rebalance. The derived value stays below the session timeout, which keeps a group moving when a member dies during a rebalance. Must be > 0 when set."`
	GroupProtocol         string        `env:"SLUICE_GROUP_PROTOCOL" envDefault:"classic" desc:"classic (JoinGroup/SyncGroup, any broker) or consumer (KIP-848: the broker assigns partitions and members reconcile one by one; Kafka 4.0+, elsewhere the group runs classic). Both pass the same crash and chaos tests; why classic is the default: docs/architecture.md#design-choices."`
	MetricsAddr           string        `env:"SLUICE_METRICS_ADDR" envDefault:":9090" expect:"a listen address such as :9090 or 127.0.0.1:9090" desc:"Listen address for /metrics, /healthz, /readyz and the state queries (/state/, docs/queries.md)."`
	QueryPeerURL          string        `env:"SLUICE_QUERY_PEER_URL" expect:"an http:// or https:// URL with {instance} in its host, such as http://{instance}.sluice:9090" desc:"Where another instance's HTTP server is, {instance} standing for its SLUICE_INSTANCE_ID: a state query for a key that another instance owns is redirected there (307). Unset, such a query is answered 421 with the owner's id (docs/queries.md)."`
	RawDLQTopic           string        `env:"SLUICE_DLQ_TOPIC" docDefault:"SLUICE_APP_ID followed by -dlq" expect:"a Kafka topic name" desc:"Dead-letter topic for records the job cannot process; headers say why."`
	LogLevel              string        `env:"SLUICE_LOG_LEVEL" envDefault:"info" desc:"Least severity logged: debug, info, warn or error."`
	AlertThreshold        float64       `env:"SLUICE_ALERT_THRESHOLD" envDefault:"10.0" desc:"temperature-alert: emit when a sensor's reading differs from its last one by this much or more (float64; see docs/jobs.md for why not strictly more). Must be >= 0."`
	RisingWindow          time.Duration `env:"SLUICE_RISING_WINDOW" envDefault:"10s" desc:"rising-temperature: how long a sensor's temperature must rise at every reading before an alert. Must be > 0."`
	TimeDomain            string        `env:"SLUICE_TIME" envDefault:"processing" desc:"rising-temperature: timers in processing time (wall clock) or event time (the record's CSV seconds, driven by the watermark)."`
	Window                time.Duration `env:"SLUICE_WINDOW" envDefault:"1m" desc:"window-average: length of the tumbling event-time windows, each aligned on the Unix epoch (see docs/windows.md). Must be at least 1ms."`
	MaxOutOfOrderness     time.Duration `env:"SLUICE_MAX_OUT_OF_ORDERNESS" envDefault:"0s" desc:"Event time: watermark = highest record time seen minus this, so records this much out of order are not late. Must be >= 0."`
	IdleTimeout           time.Duration `env:"SLUICE_IDLE_TIMEOUT" envDefault:"0s" desc:"Event time: an input that has had no record for this long stops holding the watermark back (Flink's withIdleness). Matters only for a task reading several input topics; 0 = never idle. Must be >= 0."`
	MaxTaskIdle           time.Duration `env:"SLUICE_MAX_TASK_IDLE" envDefault:"1s" desc:"A task reading several input topics takes their records in timestamp order: when one topic's next records are on the broker but not fetched yet, it holds the others back for at most this long, then goes on without them, out of order (Kafka Streams' max.task.idle.ms idea, bounded). 0 = never hold back. Must be >= 0."`
	SideOutputTopic       string        `env:"SLUICE_SIDE_OUTPUT_TOPIC" docDefault:"required by temperature-split" expect:"a Kafka topic name" desc:"temperature-split: topic for readings below 30 (the rest go to SLUICE_OUTPUT_TOPIC). rising-temperature with SLUICE_TIME=event: when set, readings behind the watermark go here (the late side output) instead of being processed. window-average: when set, readings whose window has already fired go here instead of being dropped."`
	LeaveOnShutdown       bool          `env:"SLUICE_LEAVE_ON_SHUTDOWN" envDefault:"true" desc:"On SIGTERM, after the final checkpoint, leave the consumer group so the partitions move at once. false keeps them reserved for this SLUICE_INSTANCE_ID until the session times out (a quick restart then gets them back without a rebalance)."`
	CreateTopics          bool          `env:"SLUICE_CREATE_TOPICS" envDefault:"true" desc:"Create missing output, DLQ and changelog topics at startup. Existing topics are never altered; a changelog with the wrong partition count or cleanup policy stops the instance."`
	Partitions            int           `env:"SLUICE_PARTITIONS" envDefault:"0" desc:"Partition count of the output and DLQ topics the processor creates. 0 = that of the input topic. The changelog always has the input's count. Must be >= 0."`
	StateCleanupDelay     time.Duration `env:"SLUICE_STATE_CLEANUP_DELAY" envDefault:"10m" desc:"How long the state file of a task this instance no longer owns is kept before it is deleted (Kafka Streams' state.cleanup.delay.ms). A partition back within it restores from its file. Must be > 0."`
	EpochMaxKeys          int           `env:"SLUICE_EPOCH_MAX_KEYS" envDefault:"100000" desc:"An epoch that changes more keys than this in one task ends early, so its write-set (held in memory until the commit) and its transaction stay bounded. Must be > 0."`
	RestoreFrom           string        `env:"SLUICE_RESTORE_FROM" docDefault:"unset" expect:"a savepoint location as processor savepoint prints it" desc:"Seed a new app id from this savepoint: each task whose changelog has no epoch marker yet starts from its part of the savepoint (keys placed by the current partition count, so the input may have gained partitions), then processing resumes at the savepoint's offsets. Tasks that already started ignore it, so it may stay set. A savepoint of another job, or with state the job does not have, stops the instance at start (exit 2). See docs/savepoints.md."`
	AllowNonRestoredState bool          `env:"SLUICE_ALLOW_NON_RESTORED_STATE" envDefault:"false" desc:"true: restore from SLUICE_RESTORE_FROM even when the savepoint holds state the job no longer has (it is dropped), as Flink's --allowNonRestoredState."`
	EpochMaxBytes         int           `env:"SLUICE_EPOCH_MAX_BYTES" envDefault:"67108864" desc:"Likewise for the key and value bytes one task changes in an epoch (default 64 MiB). Must be > 0."`
	RestoreConcurrency    int           `env:"SLUICE_RESTORE_CONCURRENCY" envDefault:"0" desc:"How many tasks at once may restore more than a batch (10,000 records) of their changelog (restores from scratch, long tails); the others wait, paused, while short tails never wait. Such a restore is CPU-bound and holds some 100 MiB of heap, so this bounds an instance's restore memory whatever its partition count (see docs/operations.md). 0 = GOMAXPROCS, at least 2. Must be >= 0."`
	Parallelism           int           `env:"SLUICE_PARALLELISM" envDefault:"1" desc:"How many of the instance's tasks process their records at once, each on its own goroutine, all in the instance's one transaction per epoch (Kafka Streams' num.stream.threads). 1 = one goroutine for every task. More helps a job whose processing, not the broker, is the bound and the cores to spare (see docs/operations.md); SLUICE_JOB=function always uses one. Must be >= 1."`
	PipelinedEpochs       bool          `env:"SLUICE_PIPELINED_EPOCHS" envDefault:"false" desc:"true: process each epoch while the one before is being committed (its flush: the broker acknowledging its records), holding the new epoch's outputs until that commit ends; a failed commit aborts both epochs. Exactly-once only. See docs/operations.md#pipelined-epochs."`
	StandbyReplicas       int           `env:"SLUICE_STANDBY_REPLICAS" envDefault:"0" desc:"How many other instances keep a copy of each task's state, applied from its changelog as its epochs commit (Kafka Streams' num.standby.replicas). A task whose instance crashed or left goes to the instance with its most recent copy, which restores only what the copy lacks instead of the whole changelog. Costs each copy's disk and a read of the changelog. Needs SLUICE_STATE_BACKEND=bbolt and SLUICE_GROUP_PROTOCOL=classic. See docs/operations.md#standby-replicas."`
	MaxWarmupReplicas     int           `env:"SLUICE_MAX_WARMUP_REPLICAS" envDefault:"2" desc:"With SLUICE_STANDBY_REPLICAS: how many warm-up replicas the group adds at a time (Kafka Streams' max.warmup.replicas). A task whose place in an even spread is an instance without a caught-up copy of it (one that just joined) keeps running where its copy is caught up while that instance builds a copy; once the copy is within SLUICE_ACCEPTABLE_RECOVERY_LAG, the instance asks for a rebalance and the task moves, restoring about that lag and the epochs committed since. 0 = none: tasks move at once and restore whatever the new instance lacks. See docs/operations.md#warm-up-replicas."`
	AcceptableRecoveryLag int64         `env:"SLUICE_ACCEPTABLE_RECOVERY_LAG" envDefault:"10000" desc:"With SLUICE_STANDBY_REPLICAS: how many changelog offsets a copy of a task may lag its changelog's end and still count as caught up, so that the task may move to it without a longer restore (Kafka Streams' acceptable.recovery.lag). Must be >= 1."`
	Rack                  string        `env:"SLUICE_RACK" desc:"The instance's rack or availability zone, as Kafka's client.rack (in Kubernetes, the node's topology.kubernetes.io/zone). With SLUICE_STANDBY_REPLICAS, each task's standbys go first to instances in other racks than its own instance's and its other standbys', so that losing a rack leaves a copy (Kafka Streams' rack-aware standbys). Fetches still go to the partition leaders. Empty: unknown."`
	Sink                  string        `env:"SLUICE_SINK" docDefault:"empty (none)" expect:"postgres, or empty for none" desc:"postgres: the job's results also go to a PostgreSQL table, exactly once (docs/sinks.md): aggregate upserts one row per key, echo inserts one row per input record. Needs SLUICE_GUARANTEE=exactly_once; SLUICE_OUTPUT_TOPIC becomes optional."`
	PostgresURL           string        `env:"SLUICE_POSTGRES_URL" secret:"true" docDefault:"required by SLUICE_SINK=postgres" expect:"a PostgreSQL connection string such as postgres://user:password@host:5432/db" desc:"SLUICE_SINK=postgres: the database (postgres://… or key=value). Secret: never logged nor echoed in errors. The server needs max_prepared_transactions > 0."`
	PostgresTable         string        `env:"SLUICE_POSTGRES_TABLE" docDefault:"required by SLUICE_SINK=postgres" expect:"a table name or schema.table" desc:"SLUICE_SINK=postgres: the table the rows go to, created if missing (its columns: see docs/sinks.md); one of another shape stops the instance at start. The audit table sluice_sink_epochs goes in the same schema."`
	FunctionConfig
	Security

	// gc is what the binary set the Go collector to (internal/gctune), for
	// the start-up log line; not a variable of its own.
	gc gctune.Setting
}

// FunctionConfig is the part of Config for SLUICE_JOB=function (sidecar
// mode, docs/sidecar.md): where the function listens and how it is called.
type FunctionConfig struct {
	FunctionURL           string        `env:"SLUICE_FUNCTION_URL" docDefault:"required by function" expect:"http://host:port, https://host:port or unix:///path/to/socket" desc:"function: where the user's function listens (sidecar mode, see docs/sidecar.md): http://, https:// or unix:///path."`
	FunctionProtocol      string        `env:"SLUICE_FUNCTION_PROTOCOL" envDefault:"json" desc:"function: json (Connect's unary protocol with JSON: a plain HTTP/1.1 POST), proto (the same with binary protobuf) or grpc."`
	FunctionTimeout       time.Duration `env:"SLUICE_FUNCTION_TIMEOUT" envDefault:"1s" desc:"function: timeout of one call. A batch's calls with their retries take at most (SLUICE_FUNCTION_RETRIES + 2) × this plus the backoffs, which must stay below SLUICE_TRANSACTION_TIMEOUT minus the epoch."`
	FunctionBatch         int           `env:"SLUICE_FUNCTION_BATCH" envDefault:"500" desc:"function: most events (records and timers) per call. Must be > 0."`
	FunctionConcurrency   int           `env:"SLUICE_FUNCTION_CONCURRENCY" envDefault:"4" desc:"function: most calls in flight per task, each for other keys. Must be > 0."`
	FunctionRetries       int           `env:"SLUICE_FUNCTION_RETRIES" envDefault:"3" desc:"function: retries of a key whose call timed out or failed, or that the function answered RETRY; then SLUICE_FUNCTION_ON_FAILURE applies. Must be >= 0."`
	FunctionBackoff       time.Duration `env:"SLUICE_FUNCTION_BACKOFF" envDefault:"100ms" desc:"function: wait before the first retry, doubled at each (at most 5s). Must be > 0."`
	FunctionOnFailure     string        `env:"SLUICE_FUNCTION_ON_FAILURE" envDefault:"dead_letter" desc:"function: what happens to a key's records when the function answered DEAD_LETTER or the retries are spent, and to a record the function failed (PARTIAL): dead_letter (to the DLQ with sluice.stage=function) or fail (the instance stops)."`
	FunctionMaxStateBytes int           `env:"SLUICE_FUNCTION_MAX_STATE_BYTES" envDefault:"1048576" desc:"function: largest state value the function may set (default 1 MiB); a larger one fails the key with an error naming key and state. Must be > 0."`
}

// functionProtocols are the values of SLUICE_FUNCTION_PROTOCOL.
var (
	functionProtocols = []string{"json", "proto", "grpc"}
	functionFailures  = []string{"dead_letter", "fail"}
)

// validate checks the function variables; the timeout only as far as the
// whole retry budget fits the transaction, txn the timeout in effect.
func (f FunctionConfig) validate(v *validation, job string, txn, epoch time.Duration) {
	if job == "function" || f.FunctionURL != "" {
		scheme, rest, _ := strings.Cut(f.FunctionURL, "://")
		v.check("SLUICE_FUNCTION_URL", (scheme == "http" || scheme == "https" || scheme == "unix") && rest != "" && rest != "/",
			"http://host:port, https://host:port or unix:///path/to/socket (the job function calls it)")
	}
	v.check("SLUICE_FUNCTION_PROTOCOL", slices.Contains(functionProtocols, f.FunctionProtocol), oneOf(functionProtocols))
	v.check("SLUICE_FUNCTION_BATCH", f.FunctionBatch > 0, "a number of events greater than 0")
	v.check("SLUICE_FUNCTION_CONCURRENCY", f.FunctionConcurrency > 0, "a number of calls greater than 0")
	v.check("SLUICE_FUNCTION_RETRIES", f.FunctionRetries >= 0, "a number of retries of 0 or more")
	v.check("SLUICE_FUNCTION_BACKOFF", f.FunctionBackoff > 0, "a Go duration greater than 0 such as 100ms")
	v.check("SLUICE_FUNCTION_ON_FAILURE", slices.Contains(functionFailures, f.FunctionOnFailure), oneOf(functionFailures))
	v.check("SLUICE_FUNCTION_MAX_STATE_BYTES", f.FunctionMaxStateBytes > 0, "a number of bytes greater than 0")
	v.check("SLUICE_FUNCTION_TIMEOUT", f.FunctionTimeout > 0, "a Go duration greater than 0 such as 1s")
	if job == "function" && f.FunctionTimeout > 0 && f.FunctionBackoff > 0 && f.FunctionRetries >= 0 {
		budget := f.options().Budget()
		v.check("SLUICE_FUNCTION_TIMEOUT", budget < txn-epoch,
			fmt.Sprintf("a timeout whose retry budget ((SLUICE_FUNCTION_RETRIES + 2) × timeout + backoffs = %v) stays below SLUICE_TRANSACTION_TIMEOUT minus the epoch (%v)", budget, txn-epoch))
	}
}

// options are the function job's options, without logger and registry.
func (f FunctionConfig) options() function.Options {
	retries := f.FunctionRetries
	if retries == 0 {
		retries = -1 // none; 0 is the library's default
	}
	return function.Options{
		URL:           f.FunctionURL,
		Protocol:      function.Protocol(f.FunctionProtocol),
		Timeout:       f.FunctionTimeout,
		Batch:         f.FunctionBatch,
		Concurrency:   f.FunctionConcurrency,
		Retries:       retries,
		Backoff:       f.FunctionBackoff,
		OnFailure:     function.OnFailure(f.FunctionOnFailure),
		MaxStateBytes: f.FunctionMaxStateBytes,
	}
}

// GenerateConfig is the environment of `processor generate`, which produces
// base-10 integers (the aggregate job's input) to a topic.
type GenerateConfig struct {
	Brokers []string `env:"SLUICE_BROKERS,required,notEmpty" expect:"comma-separated seed brokers such as kafka:9092" desc:"Comma-separated seed brokers (host:port)."`
	Topic   string   `env:"SLUICE_GENERATE_TOPIC,required,notEmpty" expect:"a Kafka topic name" desc:"generate: topic to write the generated records to."`
	Rate    int      `env:"SLUICE_GENERATE_RATE" envDefault:"1000" desc:"generate: records per second. Must be > 0."`
	Keys    int      `env:"SLUICE_GENERATE_KEYS" envDefault:"1000" desc:"generate: number of distinct record keys. Must be > 0."`
	// MetricsAddr serves /healthz and /readyz for `processor healthz`, so a
	// generator container has a health check too.
	MetricsAddr string `env:"SLUICE_METRICS_ADDR" envDefault:":9090" expect:"a listen address such as :9090 or 127.0.0.1:9090" desc:"Listen address for /metrics, /healthz and /readyz."`
	Security
}

// SavepointConfig is the environment of `processor savepoint`, which copies
// an application's state from its changelog to a savepoint directory.
type SavepointConfig struct {
	Brokers []string `env:"SLUICE_BROKERS,required,notEmpty" expect:"comma-separated seed brokers such as kafka:9092" desc:"Comma-separated seed brokers (host:port)."`
	AppID   string   `env:"SLUICE_APP_ID,required,notEmpty" expect:"1 to 200 of the characters a-z A-Z 0-9 . _ -" desc:"Consumer group id; prefix of the transactional id and of the internal topics (changelog, DLQ). Letters, digits, '.', '_', '-'; at most 200 characters."`
	Dir     string   `env:"SLUICE_SAVEPOINT_DIR,required,notEmpty" docDefault:"required by savepoint" expect:"a directory path, file://path, s3://bucket/prefix?region=..., gs://bucket/prefix or azblob://container/prefix" desc:"savepoint: where processor savepoint writes each new savepoint, under a name made of the app id and the UTC time: a directory path, file://path, s3://bucket/prefix with gocloud s3blob query parameters (region, endpoint, use_path_style …; credentials from the AWS SDK chain), gs://bucket/prefix in Google Cloud Storage (credentials from Application Default Credentials), or azblob://container/prefix in Azure Blob Storage (the account and credentials from AZURE_STORAGE_* or DefaultAzureCredential). See docs/savepoints.md."`
	Security
}

// AppConfig is the environment of the commands that need only the app and
// its brokers: `processor inspect`, which shows an application's group,
// tasks and open transactions from Kafka alone, and `processor resume`.
type AppConfig struct {
	Brokers []string `env:"SLUICE_BROKERS,required,notEmpty" expect:"comma-separated seed brokers such as kafka:9092" desc:"Comma-separated seed brokers (host:port)."`
	AppID   string   `env:"SLUICE_APP_ID,required,notEmpty" expect:"1 to 200 of the characters a-z A-Z 0-9 . _ -" desc:"Consumer group id; prefix of the transactional id and of the internal topics (changelog, DLQ). Letters, digits, '.', '_', '-'; at most 200 characters."`
	Security
}

// ResetConfig is the environment of `processor reset`, which deletes an
// application's group, internal topics and local state directory.
type ResetConfig struct {
	Brokers  []string `env:"SLUICE_BROKERS,required,notEmpty" expect:"comma-separated seed brokers such as kafka:9092" desc:"Comma-separated seed brokers (host:port)."`
	AppID    string   `env:"SLUICE_APP_ID,required,notEmpty" expect:"1 to 200 of the characters a-z A-Z 0-9 . _ -" desc:"Consumer group id; prefix of the transactional id and of the internal topics (changelog, DLQ). Letters, digits, '.', '_', '-'; at most 200 characters."`
	StateDir string   `env:"SLUICE_STATE_DIR" envDefault:"./state" expect:"a directory path" desc:"Local state directory: one bbolt file per task."`
	Security
}

// JobSpec is what configuration needs to know about a built-in job.
type JobSpec struct {
	Name string
	// Emits means the job writes to SLUICE_OUTPUT_TOPIC, which is then required.
	Emits bool
	// SideOutput means the job writes to SLUICE_SIDE_OUTPUT_TOPIC, which is then required.
	SideOutput bool
	// Sink means the job can write to SLUICE_SINK, and then needs no output topic.
	Sink bool
}

// ConfigError is a bad or missing variable. Its Error is one line naming the
// variable, its value and the expected form; main exits with status 2 on it.
type ConfigError struct {
	Var      string // e.g. SLUICE_CHECKPOINT_INTERVAL
	Value    string // the value in the environment or in effect; "" when missing
	Expected string // the accepted form, e.g. "a Go duration such as 200ms or 1s"
}

func (e *ConfigError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s is required: expected %s", e.Var, e.Expected)
	}
	return fmt.Sprintf("%s=%q: expected %s", e.Var, e.Value, e.Expected)
}

// Allowed values of the enumerated variables.
var (
	stateBackends  = []string{"bbolt", "memory"}
	guarantees     = []string{"exactly_once", "at_least_once"}
	groupProtocols = []string{"classic", "consumer"}
	logLevels      = []string{"debug", "info", "warn", "error"}
	timeDomains    = []string{"processing", "event"}
)

const (
	// maxAppIDLen leaves room under Kafka's 249-character topic name limit
	// for the suffixes of internal topics (-dlq, -changelog).
	maxAppIDLen = 200
	// maxNameLen is Kafka's limit for topic names and group.instance.id.
	maxNameLen = 249

	minSessionTimeout = time.Second
	// maxWireTimeout is the longest timeout Kafka's int32 millisecond fields
	// carry (session, rebalance and transaction timeouts).
	maxWireTimeout = time.Duration(math.MaxInt32) * time.Millisecond
)

// loadConfig reads Config from environ (as from env.ToMap(os.Environ())) and
// validates it for jobs, the built-in jobs. It returns a *ConfigError for the
// first problem found: unknown SLUICE_ variables first (a typo usually explains
// everything after it), then unparsable values in field order, then rules.
// SLUICE_BROKERS is checked by validateRun, since demo runs without brokers.
func loadConfig(environ map[string]string, jobs []JobSpec) (Config, error) {
	var c Config
	if err := parseEnv(&c, environ); err != nil {
		return Config{}, err
	}
	c.Brokers = trimList(c.Brokers)
	c.InputTopics = trimList(c.InputTopics)
	if c.InstanceID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return Config{}, &ConfigError{Var: "SLUICE_INSTANCE_ID", Expected: fmt.Sprintf("a stable instance name (the hostname is unavailable: %v)", err)}
		}
		c.InstanceID = h
	}
	if err := c.validate(environ, jobs); err != nil {
		return Config{}, err
	}
	return c, nil
}

// validateRun checks what only `run` needs: brokers to talk to.
func (c Config) validateRun() error {
	if len(c.Brokers) == 0 {
		return &ConfigError{Var: "SLUICE_BROKERS", Expected: expectedOf(reflect.TypeFor[Config](), "SLUICE_BROKERS")}
	}
	return nil
}

// loadGenerateConfig reads and validates GenerateConfig from environ.
func loadGenerateConfig(environ map[string]string) (GenerateConfig, error) {
	var g GenerateConfig
	if err := parseEnv(&g, environ); err != nil {
		return GenerateConfig{}, err
	}
	g.Brokers = trimList(g.Brokers)
	v := validation{environ: environ, cfg: reflect.ValueOf(g)}
	v.check("SLUICE_BROKERS", allNonEmpty(g.Brokers), "comma-separated seed brokers such as kafka:9092, without empty entries")
	v.check("SLUICE_GENERATE_TOPIC", validTopic(g.Topic), "a Kafka topic name: 1 to 249 of the characters a-z A-Z 0-9 . _ -")
	v.check("SLUICE_GENERATE_RATE", g.Rate > 0, "a number of records per second greater than 0")
	v.check("SLUICE_GENERATE_KEYS", g.Keys > 0, "a number of keys greater than 0")
	g.Security.validate(&v)
	if v.err != nil {
		return GenerateConfig{}, v.err
	}
	return g, nil
}

// loadSavepointConfig reads and validates SavepointConfig from environ.
// Dir is checked as a savepoint location (its scheme, and for an object
// store its query parameters and credentials) without reading or writing
// any object.
func loadSavepointConfig(environ map[string]string) (SavepointConfig, error) {
	var c SavepointConfig
	if err := parseEnv(&c, environ); err != nil {
		return SavepointConfig{}, err
	}
	c.Brokers = trimList(c.Brokers)
	v := validation{environ: environ, cfg: reflect.ValueOf(c)}
	v.check("SLUICE_BROKERS", allNonEmpty(c.Brokers), "comma-separated seed brokers such as kafka:9092, without empty entries")
	v.check("SLUICE_APP_ID", validName(c.AppID, maxAppIDLen), "1 to 200 of the characters a-z A-Z 0-9 . _ -")
	err := savepoint.CheckLocation(context.Background(), c.Dir)
	v.check("SLUICE_SAVEPOINT_DIR", err == nil, because(expectedOf(reflect.TypeFor[SavepointConfig](), "SLUICE_SAVEPOINT_DIR"), err))
	c.Security.validate(&v)
	if v.err != nil {
		return SavepointConfig{}, v.err
	}
	return c, nil
}

// loadAppConfig reads and validates AppConfig from environ.
func loadAppConfig(environ map[string]string) (AppConfig, error) {
	var c AppConfig
	if err := parseEnv(&c, environ); err != nil {
		return AppConfig{}, err
	}
	c.Brokers = trimList(c.Brokers)
	v := validation{environ: environ, cfg: reflect.ValueOf(c)}
	v.check("SLUICE_BROKERS", allNonEmpty(c.Brokers), "comma-separated seed brokers such as kafka:9092, without empty entries")
	v.check("SLUICE_APP_ID", validName(c.AppID, maxAppIDLen), "1 to 200 of the characters a-z A-Z 0-9 . _ -")
	c.Security.validate(&v)
	if v.err != nil {
		return AppConfig{}, v.err
	}
	return c, nil
}

// loadResetConfig reads and validates ResetConfig from environ.
func loadResetConfig(environ map[string]string) (ResetConfig, error) {
	var c ResetConfig
	if err := parseEnv(&c, environ); err != nil {
		return ResetConfig{}, err
	}
	c.Brokers = trimList(c.Brokers)
	v := validation{environ: environ, cfg: reflect.ValueOf(c)}
	v.check("SLUICE_BROKERS", allNonEmpty(c.Brokers), "comma-separated seed brokers such as kafka:9092, without empty entries")
	v.check("SLUICE_APP_ID", validName(c.AppID, maxAppIDLen), "1 to 200 of the characters a-z A-Z 0-9 . _ -")
	v.check("SLUICE_STATE_DIR", c.StateDir != "", "a directory path")
	c.Security.validate(&v)
	if v.err != nil {
		return ResetConfig{}, v.err
	}
	return c, nil
}

// TransactionTimeout is SLUICE_TRANSACTION_TIMEOUT, or when unset
// the library's default (sluice.DefaultTransactionTimeout, max(10s, 10 ×
// epoch)): room for ten epochs so a slow commit or a GC pause does not let the
// broker abort the open transaction, yet a dead instance's dangling
// transaction (which holds back every read_committed reader) ends quickly.
func (c Config) TransactionTimeout() time.Duration {
	if c.RawTransactionTimeout > 0 {
		return c.RawTransactionTimeout
	}
	return sluice.DefaultTransactionTimeout(c.epoch())
}

// CheckpointTimeout is SLUICE_CHECKPOINT_TIMEOUT, or when unset the library's
// default (sluice.DefaultCheckpointTimeout: the transaction timeout minus one
// epoch).
func (c Config) CheckpointTimeout() time.Duration {
	if c.RawCheckpointTimeout > 0 {
		return c.RawCheckpointTimeout
	}
	return sluice.DefaultCheckpointTimeout(c.TransactionTimeout(), c.epoch())
}

func (c Config) epoch() time.Duration { return sluice.Epoch(c.CheckpointInterval, c.MinPause) }

// RebalanceTimeout is SLUICE_REBALANCE_TIMEOUT, or when unset the library's
// default (sluice.DefaultRebalanceTimeout: 2/3 of the session timeout, at
// least 1s).
func (c Config) RebalanceTimeout() time.Duration {
	if c.RawRebalanceTimeout > 0 {
		return c.RawRebalanceTimeout
	}
	return sluice.DefaultRebalanceTimeout(c.SessionTimeout)
}

// DLQTopic is SLUICE_DLQ_TOPIC, or "<app id>-dlq".
func (c Config) DLQTopic() string {
	if c.RawDLQTopic != "" {
		return c.RawDLQTopic
	}
	return c.AppID + "-dlq"
}

// Level is SLUICE_LOG_LEVEL as a slog level.
func (c Config) Level() slog.Level {
	switch c.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Summary returns slog attributes of the configuration in effect, derived
// values resolved, for the startup log line. Keys are the variable names
// without the prefix, lower-cased (SLUICE_TIME is time_domain, as slog owns
// "time"). Fields tagged secret are left out.
func (c Config) Summary() []any {
	rv := reflect.ValueOf(c)
	var attrs []any
	for _, f := range reflect.VisibleFields(rv.Type()) {
		name := envName(f)
		if name == "" || f.Tag.Get("secret") == "true" {
			continue
		}
		key := strings.ToLower(strings.TrimPrefix(name, "SLUICE_"))
		if name == "SLUICE_TIME" {
			key = "time_domain" // slog's own key for the record's timestamp is "time"
		}
		var val any
		switch name {
		case "SLUICE_TRANSACTION_TIMEOUT":
			val = c.TransactionTimeout().String()
		case "SLUICE_REBALANCE_TIMEOUT":
			val = c.RebalanceTimeout().String()
		case "SLUICE_CHECKPOINT_TIMEOUT":
			val = c.CheckpointTimeout().String()
		case "SLUICE_DLQ_TOPIC":
			val = c.DLQTopic()
		default:
			val = formatValue(rv.FieldByIndex(f.Index))
		}
		attrs = append(attrs, slog.Any(key, val))
	}
	return attrs
}

func (c Config) validate(environ map[string]string, jobs []JobSpec) error {
	v := validation{environ: environ, cfg: reflect.ValueOf(c)}
	topic := "a Kafka topic name: 1 to 249 of the characters a-z A-Z 0-9 . _ -"

	v.check("SLUICE_BROKERS", allNonEmpty(c.Brokers), "comma-separated seed brokers such as kafka:9092, without empty entries")
	v.check("SLUICE_APP_ID", validName(c.AppID, maxAppIDLen), "1 to 200 of the characters a-z A-Z 0-9 . _ -")

	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.Name
	}
	i := slices.Index(names, c.Job)
	v.check("SLUICE_JOB", i >= 0, "one of "+strings.Join(slices.Sorted(slices.Values(names)), ", "))
	var job JobSpec
	if i >= 0 {
		job = jobs[i]
	}

	v.check("SLUICE_INPUT_TOPICS", len(c.InputTopics) > 0 && everyEntry(c.InputTopics, validTopic), "comma-separated Kafka topic names (letters, digits, '.', '_', '-'), without empty entries")
	sinking := c.Sink != "" && job.Sink
	if (job.Emits && !sinking) || c.OutputTopic != "" {
		v.check("SLUICE_OUTPUT_TOPIC", validTopic(c.OutputTopic), topic+writtenBy(job))
	}
	v.check("SLUICE_STATE_BACKEND", slices.Contains(stateBackends, c.StateBackend), oneOf(stateBackends))
	v.check("SLUICE_GUARANTEE", slices.Contains(guarantees, c.Guarantee), oneOf(guarantees))
	v.check("SLUICE_CHECKPOINT_INTERVAL", c.CheckpointInterval > 0, "a Go duration greater than 0 such as 100ms")
	v.check("SLUICE_CHECKPOINT_TIMEOUT", c.RawCheckpointTimeout == 0 || c.RawCheckpointTimeout > c.CheckpointInterval,
		fmt.Sprintf("a Go duration greater than SLUICE_CHECKPOINT_INTERVAL (%v)", c.CheckpointInterval))
	v.check("SLUICE_MIN_PAUSE", c.MinPause >= 0, "a Go duration of 0 or more")
	v.check("SLUICE_TOLERABLE_FAILURES", c.TolerableFailures >= 0, "an integer of 0 or more")
	v.check("SLUICE_TRANSACTION_TIMEOUT", c.RawTransactionTimeout == 0 || c.RawTransactionTimeout >= 2*c.epoch(),
		fmt.Sprintf("0 (derived) or a Go duration of at least 2 × the epoch (%v), the longer of SLUICE_CHECKPOINT_INTERVAL and SLUICE_MIN_PAUSE", 2*c.epoch()))
	v.check("SLUICE_TRANSACTION_TIMEOUT", c.TransactionTimeout() <= maxWireTimeout, "a transaction timeout of at most 596h (Kafka's limit); lower SLUICE_CHECKPOINT_INTERVAL or SLUICE_MIN_PAUSE if it is derived")
	v.check("SLUICE_INSTANCE_ID", validName(c.InstanceID, maxNameLen), "1 to 249 of the characters a-z A-Z 0-9 . _ -")
	v.check("SLUICE_SESSION_TIMEOUT", c.SessionTimeout >= minSessionTimeout && c.SessionTimeout <= maxWireTimeout, "a Go duration from 1s to 596h such as 45s")
	v.check("SLUICE_REBALANCE_TIMEOUT", c.RawRebalanceTimeout >= 0 && c.RawRebalanceTimeout <= maxWireTimeout, "0 (derived) or a Go duration from 1ms to 596h")
	v.check("SLUICE_GROUP_PROTOCOL", slices.Contains(groupProtocols, c.GroupProtocol), oneOf(groupProtocols))
	v.check("SLUICE_METRICS_ADDR", validListenAddr(c.MetricsAddr), "a listen address such as :9090 or 127.0.0.1:9090")
	if c.QueryPeerURL != "" {
		v.check("SLUICE_QUERY_PEER_URL", validPeerURL(c.QueryPeerURL), expectedOf(reflect.TypeFor[Config](), "SLUICE_QUERY_PEER_URL"))
	}
	v.check("SLUICE_DLQ_TOPIC", c.RawDLQTopic == "" || validTopic(c.RawDLQTopic), topic)
	v.check("SLUICE_LOG_LEVEL", slices.Contains(logLevels, c.LogLevel), oneOf(logLevels))
	v.check("SLUICE_ALERT_THRESHOLD", c.AlertThreshold >= 0 && !math.IsInf(c.AlertThreshold, 1), "a finite number of 0 or more such as 10.0")
	v.check("SLUICE_RISING_WINDOW", c.RisingWindow > 0, "a Go duration greater than 0 such as 10s")
	v.check("SLUICE_TIME", slices.Contains(timeDomains, c.TimeDomain), oneOf(timeDomains))
	v.check("SLUICE_WINDOW", c.Window >= time.Millisecond, "a Go duration of at least 1ms such as 1m")
	v.check("SLUICE_MAX_OUT_OF_ORDERNESS", c.MaxOutOfOrderness >= 0, "a Go duration of 0 or more")
	v.check("SLUICE_IDLE_TIMEOUT", c.IdleTimeout >= 0, "a Go duration of 0 or more")
	v.check("SLUICE_MAX_TASK_IDLE", c.MaxTaskIdle >= 0, "a Go duration of 0 or more")
	if c.RestoreFrom != "" {
		err := savepoint.CheckLocation(context.Background(), c.RestoreFrom)
		v.check("SLUICE_RESTORE_FROM", err == nil, because("a savepoint location as processor savepoint prints it: a directory path, file://path, s3://bucket/prefix?…, gs://bucket/prefix or azblob://container/prefix", err))
	}
	if job.SideOutput || c.SideOutputTopic != "" {
		v.check("SLUICE_SIDE_OUTPUT_TOPIC", validTopic(c.SideOutputTopic), topic+writtenBy(job))
	}
	v.check("SLUICE_PARTITIONS", c.Partitions >= 0, "0 (as the first input topic) or a partition count")
	v.check("SLUICE_STATE_CLEANUP_DELAY", c.StateCleanupDelay > 0, "a Go duration greater than 0 such as 10m")
	v.check("SLUICE_EPOCH_MAX_KEYS", c.EpochMaxKeys > 0, "a number of keys greater than 0")
	v.check("SLUICE_EPOCH_MAX_BYTES", c.EpochMaxBytes > 0, "a number of bytes greater than 0")
	v.check("SLUICE_PARALLELISM", c.Parallelism >= 1, "a number of tasks at once, 1 or more")
	v.check("SLUICE_RESTORE_CONCURRENCY", c.RestoreConcurrency >= 0, "a number of restores at once, 0 (GOMAXPROCS, at least 2) or more")
	v.check("SLUICE_STANDBY_REPLICAS", c.StandbyReplicas >= 0, "a number of standby replicas of each task, 0 (none) or more")
	v.check("SLUICE_MAX_WARMUP_REPLICAS", c.MaxWarmupReplicas >= 0, "a number of warm-up replicas at a time, 0 (none) or more")
	v.check("SLUICE_ACCEPTABLE_RECOVERY_LAG", c.AcceptableRecoveryLag >= 1, "a number of changelog offsets, 1 or more")
	if c.StandbyReplicas > 0 {
		v.check("SLUICE_STANDBY_REPLICAS", c.StateBackend == "bbolt", "0 with SLUICE_STATE_BACKEND="+c.StateBackend+": a standby keeps its copy in a state file")
		v.check("SLUICE_STANDBY_REPLICAS", c.GroupProtocol == "classic", "0 with SLUICE_GROUP_PROTOCOL="+c.GroupProtocol+": under KIP-848 the broker assigns partitions and knows nothing of standbys")
	}
	if c.PipelinedEpochs {
		v.check("SLUICE_PIPELINED_EPOCHS", c.Guarantee == "exactly_once", "false with SLUICE_GUARANTEE="+c.Guarantee+": at-least-once has no transaction to overlap")
	}
	c.validateSink(&v, job)
	c.FunctionConfig.validate(&v, c.Job, c.TransactionTimeout(), c.epoch())
	c.Security.validate(&v)
	return v.err
}

func writtenBy(job JobSpec) string {
	if job.Name == "" {
		return ""
	}
	return " (job " + job.Name + " writes to it)"
}

// validation keeps the first failed check as a *ConfigError.
type validation struct {
	environ map[string]string
	cfg     reflect.Value // the struct checked, to show values in effect
	err     error
}

func (v *validation) check(name string, ok bool, expected string) {
	if ok || v.err != nil {
		return
	}
	value, set := v.environ[name]
	if !set || value == "" {
		value = effectiveValue(v.cfg, name)
	}
	v.err = newConfigError(v.cfg.Type(), name, value, expected)
}

// parseEnv fills dst (a *Config, *GenerateConfig or *SavepointConfig) from environ and maps
// caarlos0/env's errors to a *ConfigError for the first failing variable.
func parseEnv(dst any, environ map[string]string) error {
	if environ == nil {
		// caarlos0/env reads the process environment when Options.Environment
		// is nil; an absent environment means no variables.
		environ = map[string]string{}
	}
	t := reflect.TypeOf(dst).Elem()
	if err := checkUnknown(environ); err != nil {
		return err
	}
	err := env.ParseWithOptions(dst, env.Options{Environment: environ})
	if err == nil {
		return nil
	}
	first := err
	var agg env.AggregateError
	if errors.As(err, &agg) && len(agg.Errors) > 0 {
		first = agg.Errors[0]
	}
	var (
		pe    env.ParseError
		unset env.VarIsNotSetError
		empty env.EmptyVarError
	)
	switch {
	case errors.As(first, &pe):
		f, _ := t.FieldByName(pe.Name)
		name := envName(f)
		return newConfigError(t, name, environ[name], expectedOf(t, name))
	case errors.As(first, &unset):
		return newConfigError(t, unset.Key, "", expectedOf(t, unset.Key))
	case errors.As(first, &empty):
		return newConfigError(t, empty.Key, "", expectedOf(t, empty.Key))
	}
	return fmt.Errorf("reading the environment: %w", err)
}

// checkUnknown rejects SLUICE_ variables that no struct reads: a typo such as
// SLUICE_CHECKPOINT_INTERVALL would otherwise be ignored in silence. Empty
// ones set nothing and are let through.
func checkUnknown(environ map[string]string) error {
	known := knownVars()
	var unknown []string
	for k, val := range environ {
		if strings.HasPrefix(k, "SLUICE_") && val != "" && !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	k := unknown[0]
	expected := "a known variable (unknown variable; see README env reference)"
	if near := nearest(k, known); near != "" {
		expected = fmt.Sprintf("a known variable (unknown variable; did you mean %s? see README env reference)", near)
	}
	return &ConfigError{Var: k, Value: environ[k], Expected: expected}
}

// envVar is one row of the configuration reference.
type envVar struct {
	Name    string
	Default string // markdown: `literal`, "required", or prose
	Meaning string
}

// envReference lists every variable of Config, then those of GenerateConfig
// and SavepointConfig not already listed, in field order: the README's
// configuration table.
func envReference() []envVar {
	var rows []envVar
	seen := map[string]bool{}
	for _, t := range []reflect.Type{reflect.TypeFor[Config](), reflect.TypeFor[GenerateConfig](), reflect.TypeFor[SavepointConfig]()} {
		for _, f := range reflect.VisibleFields(t) {
			name := envName(f)
			if name == "" || seen[name] {
				continue
			}
			seen[name] = true
			rows = append(rows, envVar{Name: name, Default: docDefault(f), Meaning: f.Tag.Get("desc")})
		}
	}
	return rows
}

func knownVars() []string {
	var names []string
	for _, r := range envReference() {
		names = append(names, r.Name)
	}
	return names
}

func docDefault(f reflect.StructField) string {
	if d := f.Tag.Get("docDefault"); d != "" {
		return d
	}
	if d, ok := f.Tag.Lookup("envDefault"); ok {
		return "`" + d + "`"
	}
	if slices.Contains(envOptions(f), "required") {
		return "required"
	}
	return "empty"
}

// envName is the variable a field is read from, "" for none.
func envName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
	if name == "-" {
		return ""
	}
	return name
}

func envOptions(f reflect.StructField) []string {
	_, opts, _ := strings.Cut(f.Tag.Get("env"), ",")
	return strings.Split(opts, ",")
}

func fieldOf(t reflect.Type, name string) (reflect.StructField, bool) {
	for _, f := range reflect.VisibleFields(t) {
		if envName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// expectedOf is the accepted form of a variable: its expect tag, else one
// derived from its Go type.
func expectedOf(t reflect.Type, name string) string {
	f, ok := fieldOf(t, name)
	if !ok {
		return "a valid value"
	}
	if e := f.Tag.Get("expect"); e != "" {
		return e
	}
	if f.Type == reflect.TypeFor[time.Duration]() {
		return "a Go duration such as 200ms or 1s"
	}
	switch f.Type.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer such as 3"
	case reflect.Float64, reflect.Float32:
		return "a decimal number such as 10.0"
	case reflect.Bool:
		return "true or false"
	}
	// Enumerations explain themselves in validate; this is the parse fallback.
	return "a valid value (see README env reference)"
}

func newConfigError(t reflect.Type, name, value, expected string) *ConfigError {
	if f, ok := fieldOf(t, name); ok && f.Tag.Get("secret") == "true" && value != "" {
		value = "<redacted>"
	}
	return &ConfigError{Var: name, Value: value, Expected: expected}
}

// effectiveValue formats the value in effect of the variable name in the
// struct cfg, for errors about a value the user did not set (a default).
func effectiveValue(cfg reflect.Value, name string) string {
	if f, ok := fieldOf(cfg.Type(), name); ok {
		return fmt.Sprint(formatValue(cfg.FieldByIndex(f.Index)))
	}
	return ""
}

// formatValue is a field's value for logs: durations as text, lists joined
// with commas as they were given, everything else as is.
func formatValue(v reflect.Value) any {
	switch x := v.Interface().(type) {
	case time.Duration:
		return x.String()
	case []string:
		return strings.Join(x, ",")
	default:
		return x
	}
}

func oneOf(vals []string) string {
	return "one of " + strings.Join(vals, ", ")
}

// trimList drops the spaces around list entries ("a, b"); empty entries are
// kept so validation can reject them.
func trimList(l []string) []string {
	for i := range l {
		l[i] = strings.TrimSpace(l[i])
	}
	return l
}

func allNonEmpty(l []string) bool {
	return everyEntry(l, func(s string) bool { return s != "" })
}

func everyEntry(l []string, ok func(string) bool) bool {
	for _, s := range l {
		if !ok(s) {
			return false
		}
	}
	return true
}

// validName reports whether s is 1..maxLen of Kafka's legal name characters,
// the rule for topic names and group.instance.id.
func validName(s string, maxLen int) bool {
	if s == "" || len(s) > maxLen {
		return false
	}
	for _, r := range s {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

func validTopic(s string) bool {
	return validName(s, maxNameLen) && s != "." && s != ".."
}

func validListenAddr(s string) bool {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	p, err := strconv.Atoi(port)
	return err == nil && p >= 0 && p <= 65535
}

// nearest returns the known name closest to name when it is a likely typo
// (edit distance at most 3), else "".
func nearest(name string, known []string) string {
	best, bestD := "", 4
	for _, k := range known {
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
