package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// testJobs mirrors the built-in jobs of DESIGN §7 as far as configuration
// cares: all of them emit, temperature-split also to a side output;
// aggregate and echo can write rows to SLUICE_SINK.
var testJobs = []JobSpec{
	{Name: "aggregate", Emits: true, Sink: true},
	{Name: "echo", Emits: true, Sink: true},
	{Name: "temperature-alert", Emits: true},
	{Name: "rising-temperature", Emits: true},
	{Name: "temperature-split", Emits: true, SideOutput: true},
	{Name: "wordcount", Emits: true},
	{Name: "function", Emits: true},
}

// baseEnv is the smallest valid environment for `run`.
func baseEnv() map[string]string {
	return map[string]string{
		"SLUICE_BROKERS":      "localhost:9092",
		"SLUICE_APP_ID":       "sluice-aggregate",
		"SLUICE_JOB":          "aggregate",
		"SLUICE_INPUT_TOPICS": "numbers",
		"SLUICE_OUTPUT_TOPIC": "aggregates",
		"SLUICE_INSTANCE_ID":  "processor-1",
	}
}

// sinkEnv is baseEnv writing to PostgreSQL instead of the output topic.
func sinkEnv() map[string]string {
	return envWith(baseEnv(), "SLUICE_OUTPUT_TOPIC", "<unset>", "SLUICE_SINK", "postgres",
		"SLUICE_POSTGRES_URL", "postgres://sluice:pw@db:5432/sluice", "SLUICE_POSTGRES_TABLE", "aggregates")
}

// With a sink the output topic is optional; the URL never reaches the
// startup log line.
func TestConfigSink(t *testing.T) {
	for _, env := range []map[string]string{sinkEnv(), envWith(sinkEnv(), "SLUICE_OUTPUT_TOPIC", "aggregates")} {
		c, err := loadConfig(env, testJobs)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(c.Summary()...) == "" || strings.Contains(fmt.Sprint(c.Summary()...), "pw@db") {
			t.Fatalf("summary shows the URL: %v", c.Summary())
		}
	}
}

func envWith(env map[string]string, kv ...string) map[string]string {
	out := maps.Clone(env)
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "<unset>" {
			delete(out, kv[i])
			continue
		}
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestConfigDefaults(t *testing.T) {
	c, err := loadConfig(baseEnv(), testJobs)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.validateRun(); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Brokers:               []string{"localhost:9092"},
		AppID:                 "sluice-aggregate",
		Job:                   "aggregate",
		InputTopics:           []string{"numbers"},
		OutputTopic:           "aggregates",
		StateDir:              "./state",
		StateBackend:          "bbolt",
		Guarantee:             "exactly_once",
		CheckpointInterval:    100 * time.Millisecond,
		TolerableFailures:     3,
		InstanceID:            "processor-1",
		SessionTimeout:        45 * time.Second,
		GroupProtocol:         "classic",
		MetricsAddr:           ":9090",
		LogLevel:              "info",
		AlertThreshold:        10.0,
		RisingWindow:          10 * time.Second,
		TimeDomain:            "processing",
		Window:                time.Minute,
		LeaveOnShutdown:       true,
		CreateTopics:          true,
		StateCleanupDelay:     10 * time.Minute,
		EpochMaxKeys:          100000,
		EpochMaxBytes:         64 << 20,
		Parallelism:           1,
		MaxTaskIdle:           time.Second,
		MaxWarmupReplicas:     2,
		AcceptableRecoveryLag: 10000,
		FunctionConfig: FunctionConfig{
			FunctionProtocol:      "json",
			FunctionTimeout:       time.Second,
			FunctionBatch:         500,
			FunctionConcurrency:   4,
			FunctionRetries:       3,
			FunctionBackoff:       100 * time.Millisecond,
			FunctionOnFailure:     "dead_letter",
			FunctionMaxStateBytes: 1 << 20,
		},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("loadConfig(base) =\n%+v\nwant\n%+v", c, want)
	}
	if got := c.TransactionTimeout(); got != 10*time.Second {
		t.Errorf("TransactionTimeout() = %v, want 10s", got)
	}
	if got := c.RebalanceTimeout(); got != 30*time.Second {
		t.Errorf("RebalanceTimeout() = %v, want 30s", got)
	}
	if got := c.CheckpointTimeout(); got != 9900*time.Millisecond {
		t.Errorf("CheckpointTimeout() = %v, want 9.9s (transaction timeout minus the epoch)", got)
	}
	if got := c.DLQTopic(); got != "sluice-aggregate-dlq" {
		t.Errorf("DLQTopic() = %q, want sluice-aggregate-dlq", got)
	}
	if got := c.Level(); got != slog.LevelInfo {
		t.Errorf("Level() = %v, want INFO", got)
	}
}

func TestConfigDerived(t *testing.T) {
	tests := []struct {
		name       string
		env        map[string]string
		txnTimeout time.Duration
		rebalance  time.Duration
		dlq        string
	}{
		{"defaults", baseEnv(), 10 * time.Second, 30 * time.Second, "sluice-aggregate-dlq"},
		{"long interval scales the transaction timeout", envWith(baseEnv(), "SLUICE_CHECKPOINT_INTERVAL", "2s"), 20 * time.Second, 30 * time.Second, "sluice-aggregate-dlq"},
		{"min pause stretches the epoch", envWith(baseEnv(), "SLUICE_MIN_PAUSE", "3s"), 30 * time.Second, 30 * time.Second, "sluice-aggregate-dlq"},
		{"explicit transaction timeout", envWith(baseEnv(), "SLUICE_TRANSACTION_TIMEOUT", "5s"), 5 * time.Second, 30 * time.Second, "sluice-aggregate-dlq"},
		{"explicit 0 means derived", envWith(baseEnv(), "SLUICE_TRANSACTION_TIMEOUT", "0", "SLUICE_REBALANCE_TIMEOUT", "0s"), 10 * time.Second, 30 * time.Second, "sluice-aggregate-dlq"},
		{"acceptance session timeout", envWith(baseEnv(), "SLUICE_SESSION_TIMEOUT", "6s"), 10 * time.Second, 4 * time.Second, "sluice-aggregate-dlq"},
		{"rebalance timeout at least 1s", envWith(baseEnv(), "SLUICE_SESSION_TIMEOUT", "1s"), 10 * time.Second, time.Second, "sluice-aggregate-dlq"},
		{"explicit rebalance timeout", envWith(baseEnv(), "SLUICE_REBALANCE_TIMEOUT", "90s"), 10 * time.Second, 90 * time.Second, "sluice-aggregate-dlq"},
		{"explicit dlq", envWith(baseEnv(), "SLUICE_DLQ_TOPIC", "bad-records"), 10 * time.Second, 30 * time.Second, "bad-records"},
		{"dlq follows app id", envWith(baseEnv(), "SLUICE_APP_ID", "billing.v2"), 10 * time.Second, 30 * time.Second, "billing.v2-dlq"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadConfig(tt.env, testJobs)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.TransactionTimeout(); got != tt.txnTimeout {
				t.Errorf("TransactionTimeout() = %v, want %v", got, tt.txnTimeout)
			}
			if got := c.RebalanceTimeout(); got != tt.rebalance {
				t.Errorf("RebalanceTimeout() = %v, want %v", got, tt.rebalance)
			}
			if got := c.DLQTopic(); got != tt.dlq {
				t.Errorf("DLQTopic() = %q, want %q", got, tt.dlq)
			}
		})
	}
}

// SLUICE_MAX_TASK_IDLE reaches the engine as Options.MaxTaskIdle, where 0
// is the default: the variable's 0, never holding records back, becomes a
// negative value.
func TestConfigMaxTaskIdle(t *testing.T) {
	for _, tt := range []struct {
		value string // "" leaves it unset
		want  time.Duration
	}{
		{"", time.Second},
		{"30s", 30 * time.Second},
		{"0", -1},
		{"0s", -1},
	} {
		env := baseEnv()
		if tt.value != "" {
			env = envWith(env, "SLUICE_MAX_TASK_IDLE", tt.value)
		}
		c, err := loadConfig(env, testJobs)
		if err != nil {
			t.Fatal(err)
		}
		if got := engineOptions(c, nil, nil).MaxTaskIdle; got != tt.want {
			t.Errorf("SLUICE_MAX_TASK_IDLE=%q: Options.MaxTaskIdle = %v, want %v", tt.value, got, tt.want)
		}
	}
}

func TestConfigValues(t *testing.T) {
	c, err := loadConfig(envWith(baseEnv(),
		"SLUICE_BROKERS", "a:9092, b:9092 ,c:9092",
		"SLUICE_INPUT_TOPICS", "left,right",
		"SLUICE_STATE_BACKEND", "memory",
		"SLUICE_GUARANTEE", "at_least_once",
		"SLUICE_GROUP_PROTOCOL", "consumer",
		"SLUICE_LOG_LEVEL", "debug",
		"SLUICE_ALERT_THRESHOLD", "2.5",
		"SLUICE_TIME", "event",
		"SLUICE_MAX_OUT_OF_ORDERNESS", "5s",
		"SLUICE_CREATE_TOPICS", "false",
		"SLUICE_PARTITIONS", "12",
		"SLUICE_JOB", "temperature-split",
		"SLUICE_SIDE_OUTPUT_TOPIC", "low",
	), testJobs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Brokers, []string{"a:9092", "b:9092", "c:9092"}) {
		t.Errorf("Brokers = %q", c.Brokers)
	}
	if !slices.Equal(c.InputTopics, []string{"left", "right"}) {
		t.Errorf("InputTopics = %q", c.InputTopics)
	}
	if c.StateBackend != "memory" || c.Guarantee != "at_least_once" || c.GroupProtocol != "consumer" ||
		c.Level() != slog.LevelDebug || c.AlertThreshold != 2.5 || c.TimeDomain != "event" ||
		c.MaxOutOfOrderness != 5*time.Second || c.CreateTopics || c.Partitions != 12 || c.SideOutputTopic != "low" {
		t.Errorf("values not read: %+v", c)
	}
}

type configErrorTest struct {
	name    string
	env     map[string]string
	wantVar string
	// wantMsg, when set, is the exact Error() text.
	wantMsg string
}

// configErrorTests give every variable a bad value, plus the missing and
// cross-field cases. TestConfigErrorsCoverEveryVariable keeps them complete.
var configErrorTests = []configErrorTest{
	{"empty broker entry", envWith(baseEnv(), "SLUICE_BROKERS", "a:9092,,b:9092"), "SLUICE_BROKERS", ""},
	{"missing app id", envWith(baseEnv(), "SLUICE_APP_ID", "<unset>"), "SLUICE_APP_ID",
		"SLUICE_APP_ID is required: expected 1 to 200 of the characters a-z A-Z 0-9 . _ -"},
	{"empty app id", envWith(baseEnv(), "SLUICE_APP_ID", ""), "SLUICE_APP_ID", "SLUICE_APP_ID is required: expected 1 to 200 of the characters a-z A-Z 0-9 . _ -"},
	{"app id with a slash", envWith(baseEnv(), "SLUICE_APP_ID", "team/app"), "SLUICE_APP_ID",
		`SLUICE_APP_ID="team/app": expected 1 to 200 of the characters a-z A-Z 0-9 . _ -`},
	{"app id too long", envWith(baseEnv(), "SLUICE_APP_ID", strings.Repeat("a", 201)), "SLUICE_APP_ID", ""},
	{"unknown job", envWith(baseEnv(), "SLUICE_JOB", "sum"), "SLUICE_JOB",
		`SLUICE_JOB="sum": expected one of aggregate, echo, function, rising-temperature, temperature-alert, temperature-split, wordcount`},
	{"missing job", envWith(baseEnv(), "SLUICE_JOB", "<unset>"), "SLUICE_JOB",
		"SLUICE_JOB is required: expected one of aggregate, echo, function, rising-temperature, temperature-alert, temperature-split, wordcount"},
	{"missing input topics", envWith(baseEnv(), "SLUICE_INPUT_TOPICS", "<unset>"), "SLUICE_INPUT_TOPICS", ""},
	{"bad input topic", envWith(baseEnv(), "SLUICE_INPUT_TOPICS", "numbers,no spaces"), "SLUICE_INPUT_TOPICS", ""},
	{"input topic list of blanks", envWith(baseEnv(), "SLUICE_INPUT_TOPICS", " , "), "SLUICE_INPUT_TOPICS", ""},
	{"missing output for an emitting job", envWith(baseEnv(), "SLUICE_OUTPUT_TOPIC", "<unset>"), "SLUICE_OUTPUT_TOPIC",
		"SLUICE_OUTPUT_TOPIC is required: expected a Kafka topic name: 1 to 249 of the characters a-z A-Z 0-9 . _ - (job aggregate writes to it)"},
	{"bad output topic", envWith(baseEnv(), "SLUICE_OUTPUT_TOPIC", ".."), "SLUICE_OUTPUT_TOPIC", ""},
	{"state backend", envWith(baseEnv(), "SLUICE_STATE_BACKEND", "rocksdb"), "SLUICE_STATE_BACKEND",
		`SLUICE_STATE_BACKEND="rocksdb": expected one of bbolt, memory`},
	{"guarantee", envWith(baseEnv(), "SLUICE_GUARANTEE", "exactly-once"), "SLUICE_GUARANTEE",
		`SLUICE_GUARANTEE="exactly-once": expected one of exactly_once, at_least_once`},
	{"non-duration checkpoint interval", envWith(baseEnv(), "SLUICE_CHECKPOINT_INTERVAL", "abc"), "SLUICE_CHECKPOINT_INTERVAL",
		`SLUICE_CHECKPOINT_INTERVAL="abc": expected a Go duration such as 200ms or 1s`},
	{"unitless checkpoint interval", envWith(baseEnv(), "SLUICE_CHECKPOINT_INTERVAL", "100"), "SLUICE_CHECKPOINT_INTERVAL", ""},
	{"zero checkpoint interval", envWith(baseEnv(), "SLUICE_CHECKPOINT_INTERVAL", "0s"), "SLUICE_CHECKPOINT_INTERVAL",
		`SLUICE_CHECKPOINT_INTERVAL="0s": expected a Go duration greater than 0 such as 100ms`},
	{"checkpoint timeout not a duration", envWith(baseEnv(), "SLUICE_CHECKPOINT_TIMEOUT", "soon"), "SLUICE_CHECKPOINT_TIMEOUT", ""},
	{"checkpoint timeout below interval", envWith(baseEnv(), "SLUICE_CHECKPOINT_TIMEOUT", "50ms"), "SLUICE_CHECKPOINT_TIMEOUT",
		`SLUICE_CHECKPOINT_TIMEOUT="50ms": expected a Go duration greater than SLUICE_CHECKPOINT_INTERVAL (100ms)`},
	{"min pause not a duration", envWith(baseEnv(), "SLUICE_MIN_PAUSE", "1"), "SLUICE_MIN_PAUSE", ""},
	{"negative min pause", envWith(baseEnv(), "SLUICE_MIN_PAUSE", "-1s"), "SLUICE_MIN_PAUSE", ""},
	{"tolerable failures not an int", envWith(baseEnv(), "SLUICE_TOLERABLE_FAILURES", "three"), "SLUICE_TOLERABLE_FAILURES",
		`SLUICE_TOLERABLE_FAILURES="three": expected an integer such as 3`},
	{"negative tolerable failures", envWith(baseEnv(), "SLUICE_TOLERABLE_FAILURES", "-1"), "SLUICE_TOLERABLE_FAILURES", ""},
	{"transaction timeout not a duration", envWith(baseEnv(), "SLUICE_TRANSACTION_TIMEOUT", "1 minute"), "SLUICE_TRANSACTION_TIMEOUT", ""},
	{"transaction timeout without margin", envWith(baseEnv(), "SLUICE_CHECKPOINT_INTERVAL", "1s", "SLUICE_TRANSACTION_TIMEOUT", "1500ms"), "SLUICE_TRANSACTION_TIMEOUT",
		`SLUICE_TRANSACTION_TIMEOUT="1500ms": expected 0 (derived) or a Go duration of at least 2 × the epoch (2s), the longer of SLUICE_CHECKPOINT_INTERVAL and SLUICE_MIN_PAUSE`},
	{"transaction timeout below min pause", envWith(baseEnv(), "SLUICE_MIN_PAUSE", "10s", "SLUICE_TRANSACTION_TIMEOUT", "15s"), "SLUICE_TRANSACTION_TIMEOUT", ""},
	{"negative transaction timeout", envWith(baseEnv(), "SLUICE_TRANSACTION_TIMEOUT", "-5s"), "SLUICE_TRANSACTION_TIMEOUT", ""},
	{"instance id with a space", envWith(baseEnv(), "SLUICE_INSTANCE_ID", "processor 1"), "SLUICE_INSTANCE_ID", ""},
	{"session timeout not a duration", envWith(baseEnv(), "SLUICE_SESSION_TIMEOUT", "45"), "SLUICE_SESSION_TIMEOUT", ""},
	{"session timeout too short", envWith(baseEnv(), "SLUICE_SESSION_TIMEOUT", "500ms"), "SLUICE_SESSION_TIMEOUT", ""},
	{"rebalance timeout not a duration", envWith(baseEnv(), "SLUICE_REBALANCE_TIMEOUT", "x"), "SLUICE_REBALANCE_TIMEOUT", ""},
	{"negative rebalance timeout", envWith(baseEnv(), "SLUICE_REBALANCE_TIMEOUT", "-1s"), "SLUICE_REBALANCE_TIMEOUT", ""},
	{"group protocol", envWith(baseEnv(), "SLUICE_GROUP_PROTOCOL", "kip848"), "SLUICE_GROUP_PROTOCOL", ""},
	{"metrics addr without port", envWith(baseEnv(), "SLUICE_METRICS_ADDR", "localhost"), "SLUICE_METRICS_ADDR", ""},
	{"metrics addr port out of range", envWith(baseEnv(), "SLUICE_METRICS_ADDR", ":99999"), "SLUICE_METRICS_ADDR", ""},
	{"peer url without the instance", envWith(baseEnv(), "SLUICE_QUERY_PEER_URL", "http://sluice:9090"), "SLUICE_QUERY_PEER_URL",
		`SLUICE_QUERY_PEER_URL="http://sluice:9090": expected an http:// or https:// URL with {instance} in its host, such as http://{instance}.sluice:9090`},
	{"peer url with the instance in its path", envWith(baseEnv(), "SLUICE_QUERY_PEER_URL", "http://sluice:9090/{instance}"), "SLUICE_QUERY_PEER_URL", ""},
	{"peer url not http", envWith(baseEnv(), "SLUICE_QUERY_PEER_URL", "ftp://{instance}:9090"), "SLUICE_QUERY_PEER_URL", ""},
	{"peer url with a query", envWith(baseEnv(), "SLUICE_QUERY_PEER_URL", "http://{instance}:9090?x=1"), "SLUICE_QUERY_PEER_URL", ""},
	{"dlq topic", envWith(baseEnv(), "SLUICE_DLQ_TOPIC", "dlq#1"), "SLUICE_DLQ_TOPIC", ""},
	{"log level", envWith(baseEnv(), "SLUICE_LOG_LEVEL", "verbose"), "SLUICE_LOG_LEVEL",
		`SLUICE_LOG_LEVEL="verbose": expected one of debug, info, warn, error`},
	{"alert threshold not a number", envWith(baseEnv(), "SLUICE_ALERT_THRESHOLD", "ten"), "SLUICE_ALERT_THRESHOLD",
		`SLUICE_ALERT_THRESHOLD="ten": expected a decimal number such as 10.0`},
	{"alert threshold NaN", envWith(baseEnv(), "SLUICE_ALERT_THRESHOLD", "NaN"), "SLUICE_ALERT_THRESHOLD", ""},
	{"alert threshold infinite", envWith(baseEnv(), "SLUICE_ALERT_THRESHOLD", "+Inf"), "SLUICE_ALERT_THRESHOLD", ""},
	{"negative alert threshold", envWith(baseEnv(), "SLUICE_ALERT_THRESHOLD", "-1"), "SLUICE_ALERT_THRESHOLD", ""},
	{"rising window not a duration", envWith(baseEnv(), "SLUICE_RISING_WINDOW", "10"), "SLUICE_RISING_WINDOW", ""},
	{"zero rising window", envWith(baseEnv(), "SLUICE_RISING_WINDOW", "0s"), "SLUICE_RISING_WINDOW", ""},
	{"window not a duration", envWith(baseEnv(), "SLUICE_WINDOW", "60"), "SLUICE_WINDOW", ""},
	{"window under a millisecond", envWith(baseEnv(), "SLUICE_WINDOW", "500us"), "SLUICE_WINDOW", `SLUICE_WINDOW="500us": expected a Go duration of at least 1ms such as 1m`},
	{"time domain", envWith(baseEnv(), "SLUICE_TIME", "ingestion"), "SLUICE_TIME", ""},
	{"max out of orderness not a duration", envWith(baseEnv(), "SLUICE_MAX_OUT_OF_ORDERNESS", "late"), "SLUICE_MAX_OUT_OF_ORDERNESS", ""},
	{"negative max out of orderness", envWith(baseEnv(), "SLUICE_MAX_OUT_OF_ORDERNESS", "-1ms"), "SLUICE_MAX_OUT_OF_ORDERNESS", ""},
	{"idle timeout not a duration", envWith(baseEnv(), "SLUICE_IDLE_TIMEOUT", "soon"), "SLUICE_IDLE_TIMEOUT", ""},
	{"negative idle timeout", envWith(baseEnv(), "SLUICE_IDLE_TIMEOUT", "-1s"), "SLUICE_IDLE_TIMEOUT", ""},
	{"max task idle not a duration", envWith(baseEnv(), "SLUICE_MAX_TASK_IDLE", "1"), "SLUICE_MAX_TASK_IDLE", ""},
	{"negative max task idle", envWith(baseEnv(), "SLUICE_MAX_TASK_IDLE", "-1s"), "SLUICE_MAX_TASK_IDLE", ""},
	{"missing side output for temperature-split", envWith(baseEnv(), "SLUICE_JOB", "temperature-split"), "SLUICE_SIDE_OUTPUT_TOPIC",
		"SLUICE_SIDE_OUTPUT_TOPIC is required: expected a Kafka topic name: 1 to 249 of the characters a-z A-Z 0-9 . _ - (job temperature-split writes to it)"},
	{"bad side output topic", envWith(baseEnv(), "SLUICE_SIDE_OUTPUT_TOPIC", "a:b"), "SLUICE_SIDE_OUTPUT_TOPIC", ""},
	{"create topics not a bool", envWith(baseEnv(), "SLUICE_CREATE_TOPICS", "maybe"), "SLUICE_CREATE_TOPICS",
		`SLUICE_CREATE_TOPICS="maybe": expected true or false`},
	{"restore from an unknown scheme", envWith(baseEnv(), "SLUICE_RESTORE_FROM", "ftp://host/sp"), "SLUICE_RESTORE_FROM", ""},
	{"allow non-restored state not a bool", envWith(baseEnv(), "SLUICE_ALLOW_NON_RESTORED_STATE", "maybe"), "SLUICE_ALLOW_NON_RESTORED_STATE",
		`SLUICE_ALLOW_NON_RESTORED_STATE="maybe": expected true or false`},
	{"leave on shutdown not a bool", envWith(baseEnv(), "SLUICE_LEAVE_ON_SHUTDOWN", "sometimes"), "SLUICE_LEAVE_ON_SHUTDOWN",
		`SLUICE_LEAVE_ON_SHUTDOWN="sometimes": expected true or false`},
	{"partitions not an int", envWith(baseEnv(), "SLUICE_PARTITIONS", "six"), "SLUICE_PARTITIONS", ""},
	{"negative partitions", envWith(baseEnv(), "SLUICE_PARTITIONS", "-6"), "SLUICE_PARTITIONS", ""},
	{"zero cleanup delay", envWith(baseEnv(), "SLUICE_STATE_CLEANUP_DELAY", "0s"), "SLUICE_STATE_CLEANUP_DELAY", ""},
	{"cleanup delay not a duration", envWith(baseEnv(), "SLUICE_STATE_CLEANUP_DELAY", "soon"), "SLUICE_STATE_CLEANUP_DELAY", ""},
	{"zero epoch keys", envWith(baseEnv(), "SLUICE_EPOCH_MAX_KEYS", "0"), "SLUICE_EPOCH_MAX_KEYS", ""},
	{"epoch bytes not a number", envWith(baseEnv(), "SLUICE_EPOCH_MAX_BYTES", "64MiB"), "SLUICE_EPOCH_MAX_BYTES", ""},
	{"zero parallelism", envWith(baseEnv(), "SLUICE_PARALLELISM", "0"), "SLUICE_PARALLELISM",
		`SLUICE_PARALLELISM="0": expected a number of tasks at once, 1 or more`},
	{"parallelism not a number", envWith(baseEnv(), "SLUICE_PARALLELISM", "auto"), "SLUICE_PARALLELISM", ""},
	{"pipelined epochs not a bool", envWith(baseEnv(), "SLUICE_PIPELINED_EPOCHS", "yes please"), "SLUICE_PIPELINED_EPOCHS", ""},
	{"pipelined epochs at least once", envWith(envWith(baseEnv(), "SLUICE_PIPELINED_EPOCHS", "true"), "SLUICE_GUARANTEE", "at_least_once"), "SLUICE_PIPELINED_EPOCHS",
		`SLUICE_PIPELINED_EPOCHS="true": expected false with SLUICE_GUARANTEE=at_least_once: at-least-once has no transaction to overlap`},
	{"negative standby replicas", envWith(baseEnv(), "SLUICE_STANDBY_REPLICAS", "-1"), "SLUICE_STANDBY_REPLICAS",
		`SLUICE_STANDBY_REPLICAS="-1": expected a number of standby replicas of each task, 0 (none) or more`},
	{"negative warm-up replicas", envWith(baseEnv(), "SLUICE_MAX_WARMUP_REPLICAS", "-2"), "SLUICE_MAX_WARMUP_REPLICAS",
		`SLUICE_MAX_WARMUP_REPLICAS="-2": expected a number of warm-up replicas at a time, 0 (none) or more`},
	{"no acceptable recovery lag", envWith(baseEnv(), "SLUICE_ACCEPTABLE_RECOVERY_LAG", "0"), "SLUICE_ACCEPTABLE_RECOVERY_LAG",
		`SLUICE_ACCEPTABLE_RECOVERY_LAG="0": expected a number of changelog offsets, 1 or more`},
	{"standby replicas in memory", envWith(envWith(baseEnv(), "SLUICE_STANDBY_REPLICAS", "1"), "SLUICE_STATE_BACKEND", "memory"), "SLUICE_STANDBY_REPLICAS",
		`SLUICE_STANDBY_REPLICAS="1": expected 0 with SLUICE_STATE_BACKEND=memory: a standby keeps its copy in a state file`},
	{"standby replicas under KIP-848", envWith(envWith(baseEnv(), "SLUICE_STANDBY_REPLICAS", "2"), "SLUICE_GROUP_PROTOCOL", "consumer"), "SLUICE_STANDBY_REPLICAS",
		`SLUICE_STANDBY_REPLICAS="2": expected 0 with SLUICE_GROUP_PROTOCOL=consumer: under KIP-848 the broker assigns partitions and knows nothing of standbys`},
	{"negative restore concurrency", envWith(baseEnv(), "SLUICE_RESTORE_CONCURRENCY", "-1"), "SLUICE_RESTORE_CONCURRENCY",
		`SLUICE_RESTORE_CONCURRENCY="-1": expected a number of restores at once, 0 (GOMAXPROCS, at least 2) or more`},
	{"unknown sink", envWith(baseEnv(), "SLUICE_SINK", "mysql"), "SLUICE_SINK", `SLUICE_SINK="mysql": expected postgres, or empty for none`},
	{"sink for a job without rows", envWith(sinkEnv(), "SLUICE_JOB", "temperature-alert", "SLUICE_OUTPUT_TOPIC", "alerts"), "SLUICE_SINK", ""},
	{"sink at least once", envWith(sinkEnv(), "SLUICE_GUARANTEE", "at_least_once"), "SLUICE_GUARANTEE", ""},
	{"sink without url", envWith(sinkEnv(), "SLUICE_POSTGRES_URL", "<unset>"), "SLUICE_POSTGRES_URL",
		"SLUICE_POSTGRES_URL is required: expected a PostgreSQL connection string such as postgres://user:password@host:5432/db"},
	{"sink url does not parse, password not echoed", envWith(sinkEnv(), "SLUICE_POSTGRES_URL", "postgres://u:hunter2@db:port/x"), "SLUICE_POSTGRES_URL",
		`SLUICE_POSTGRES_URL="<redacted>": expected a PostgreSQL connection string such as postgres://user:password@host:5432/db`},
	{"sink with a long app id", envWith(sinkEnv(), "SLUICE_APP_ID", strings.Repeat("a", 131)), "SLUICE_APP_ID", ""},
	{"sink without table", envWith(sinkEnv(), "SLUICE_POSTGRES_TABLE", "<unset>"), "SLUICE_POSTGRES_TABLE", ""},
	{"sink table of three parts", envWith(sinkEnv(), "SLUICE_POSTGRES_TABLE", "a.b.c"), "SLUICE_POSTGRES_TABLE", ""},
	{"function without url", envWith(baseEnv(), "SLUICE_JOB", "function"), "SLUICE_FUNCTION_URL",
		"SLUICE_FUNCTION_URL is required: expected http://host:port, https://host:port or unix:///path/to/socket (the job function calls it)"},
	{"function url of another scheme", envWith(baseEnv(), "SLUICE_JOB", "function", "SLUICE_FUNCTION_URL", "tcp://fn:8080"), "SLUICE_FUNCTION_URL", ""},
	{"function unix url without path", envWith(baseEnv(), "SLUICE_JOB", "function", "SLUICE_FUNCTION_URL", "unix:///"), "SLUICE_FUNCTION_URL", ""},
	{"unknown function protocol", envWith(baseEnv(), "SLUICE_FUNCTION_PROTOCOL", "http"), "SLUICE_FUNCTION_PROTOCOL",
		`SLUICE_FUNCTION_PROTOCOL="http": expected one of json, proto, grpc`},
	{"zero function timeout", envWith(baseEnv(), "SLUICE_FUNCTION_TIMEOUT", "0s"), "SLUICE_FUNCTION_TIMEOUT", ""},
	{"function retry budget above the transaction", envWith(baseEnv(), "SLUICE_JOB", "function", "SLUICE_FUNCTION_URL", "http://127.0.0.1:8080", "SLUICE_FUNCTION_TIMEOUT", "2s"), "SLUICE_FUNCTION_TIMEOUT",
		`SLUICE_FUNCTION_TIMEOUT="2s": expected a timeout whose retry budget ((SLUICE_FUNCTION_RETRIES + 2) × timeout + backoffs = 10.7s) stays below SLUICE_TRANSACTION_TIMEOUT minus the epoch (9.9s)`},
	{"zero function batch", envWith(baseEnv(), "SLUICE_FUNCTION_BATCH", "0"), "SLUICE_FUNCTION_BATCH", ""},
	{"function concurrency not a number", envWith(baseEnv(), "SLUICE_FUNCTION_CONCURRENCY", "many"), "SLUICE_FUNCTION_CONCURRENCY", ""},
	{"negative function retries", envWith(baseEnv(), "SLUICE_FUNCTION_RETRIES", "-1"), "SLUICE_FUNCTION_RETRIES", ""},
	{"zero function backoff", envWith(baseEnv(), "SLUICE_FUNCTION_BACKOFF", "0s"), "SLUICE_FUNCTION_BACKOFF", ""},
	{"unknown function failure", envWith(baseEnv(), "SLUICE_FUNCTION_ON_FAILURE", "skip"), "SLUICE_FUNCTION_ON_FAILURE",
		`SLUICE_FUNCTION_ON_FAILURE="skip": expected one of dead_letter, fail`},
	{"zero function state cap", envWith(baseEnv(), "SLUICE_FUNCTION_MAX_STATE_BYTES", "0"), "SLUICE_FUNCTION_MAX_STATE_BYTES", ""},
	{"unknown variable", envWith(baseEnv(), "SLUICE_CHECKPOINT_INTERVALL", "200ms"), "SLUICE_CHECKPOINT_INTERVALL",
		`SLUICE_CHECKPOINT_INTERVALL="200ms": expected a known variable (unknown variable; did you mean SLUICE_CHECKPOINT_INTERVAL? see README env reference)`},
	{"unknown variable far from any", envWith(baseEnv(), "SLUICE_FROBNICATE", "1"), "SLUICE_FROBNICATE",
		`SLUICE_FROBNICATE="1": expected a known variable (unknown variable; see README env reference)`},
	{"unknown variable reported before parse errors", envWith(baseEnv(), "SLUICE_APP_ID", "<unset>", "SLUICE_APPID", "x"), "SLUICE_APPID", ""},
	{"first parse error in field order", envWith(baseEnv(), "SLUICE_SESSION_TIMEOUT", "x", "SLUICE_CHECKPOINT_INTERVAL", "y"), "SLUICE_CHECKPOINT_INTERVAL", ""},
}

func TestConfigErrors(t *testing.T) {
	for _, tt := range configErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(tt.env, testJobs)
			assertConfigError(t, err, tt.wantVar, tt.wantMsg)
		})
	}
}

func assertConfigError(t *testing.T, err error, wantVar, wantMsg string) {
	t.Helper()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v (%T), want a *ConfigError for %s", err, err, wantVar)
	}
	if ce.Var != wantVar {
		t.Errorf("Var = %s, want %s (error: %v)", ce.Var, wantVar, err)
	}
	msg := err.Error()
	if wantMsg != "" && msg != wantMsg {
		t.Errorf("Error() =\n%s\nwant\n%s", msg, wantMsg)
	}
	if !strings.HasPrefix(msg, wantVar) || strings.Contains(msg, "\n") || !strings.Contains(msg, "expected ") {
		t.Errorf("Error() = %q: want one line starting with the variable and saying what is expected", msg)
	}
}

// TestConfigErrorsCoverEveryVariable fails when a variable is added without
// a bad-value case in TestConfigErrors (or TestGenerateConfigErrors).
func TestConfigErrorsCoverEveryVariable(t *testing.T) {
	covered := map[string]bool{}
	for _, tt := range slices.Concat(configErrorTests, generateErrorTests, savepointErrorTests, securityErrorTests) {
		covered[tt.wantVar] = true
	}
	// Any string is a usable state directory, and a rack's name (as
	// Kafka's client.rack).
	noBadValue := []string{"SLUICE_STATE_DIR", "SLUICE_RACK"}
	for _, name := range knownVars() {
		if !covered[name] && !slices.Contains(noBadValue, name) {
			t.Errorf("%s has no bad-value case", name)
		}
	}
}

func TestConfigValidateRun(t *testing.T) {
	c, err := loadConfig(envWith(baseEnv(), "SLUICE_BROKERS", "<unset>"), testJobs)
	if err != nil {
		t.Fatalf("loadConfig without brokers (demo): %v", err)
	}
	assertConfigError(t, c.validateRun(), "SLUICE_BROKERS",
		"SLUICE_BROKERS is required: expected comma-separated seed brokers such as kafka:9092")
}

func TestConfigInstanceIDDefaultsToHostname(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip("no hostname:", err)
	}
	c, err := loadConfig(envWith(baseEnv(), "SLUICE_INSTANCE_ID", "<unset>"), testJobs)
	if err != nil {
		t.Fatal(err)
	}
	if c.InstanceID != host {
		t.Errorf("InstanceID = %q, want the hostname %q", c.InstanceID, host)
	}
}

// caarlos0/env reads the process environment when given a nil map; loadConfig
// must not.
func TestConfigNilEnvironIgnoresProcessEnv(t *testing.T) {
	t.Setenv("SLUICE_APP_ID", "from-process")
	_, err := loadConfig(nil, testJobs)
	assertConfigError(t, err, "SLUICE_APP_ID", "")
}

func TestConfigOptionalTopicsOfOtherJobs(t *testing.T) {
	// echo does not write a side output, so none is required; a given one is
	// still checked.
	if _, err := loadConfig(envWith(baseEnv(), "SLUICE_JOB", "echo"), testJobs); err != nil {
		t.Fatal(err)
	}
	quiet := []JobSpec{{Name: "sink"}}
	if _, err := loadConfig(envWith(baseEnv(), "SLUICE_JOB", "sink", "SLUICE_OUTPUT_TOPIC", "<unset>"), quiet); err != nil {
		t.Fatalf("job that does not emit: %v", err)
	}
}

func TestConfigSummary(t *testing.T) {
	c, err := loadConfig(envWith(baseEnv(), "SLUICE_SESSION_TIMEOUT", "6s"), testJobs)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, a := range c.Summary() {
		attr, ok := a.(slog.Attr)
		if !ok {
			t.Fatalf("Summary() item %v is a %T, want slog.Attr", a, a)
		}
		got[attr.Key] = attr.Value.Any()
	}
	if n := len(reflectFieldsWithEnv()); len(got) != n {
		t.Errorf("Summary() has %d attrs, want one per variable that is not secret (%d): %v", len(got), n, got)
	}
	for k, want := range map[string]any{
		"app_id":              "sluice-aggregate",
		"brokers":             "localhost:9092",
		"checkpoint_interval": "100ms",
		"transaction_timeout": "10s",
		"rebalance_timeout":   "4s",
		"dlq_topic":           "sluice-aggregate-dlq",
		"create_topics":       true,
		"tolerable_failures":  int64(3),
		"time_domain":         "processing",
	} {
		if got[k] != want {
			t.Errorf("Summary()[%s] = %v, want %v", k, got[k], want)
		}
	}
}

func reflectFieldsWithEnv() []string {
	var names []string
	for _, r := range envReference() {
		f, ok := fieldOf(reflect.TypeFor[Config](), r.Name)
		if ok && f.Tag.Get("secret") != "true" {
			names = append(names, r.Name)
		}
	}
	return names
}

func TestGenerateConfig(t *testing.T) {
	g, err := loadGenerateConfig(generateBase())
	if err != nil {
		t.Fatal(err)
	}
	want := GenerateConfig{Brokers: []string{"kafka:9092"}, Topic: "numbers", Rate: 1000, Keys: 1000}
	if !slices.Equal(g.Brokers, want.Brokers) || g.Topic != want.Topic || g.Rate != want.Rate || g.Keys != want.Keys {
		t.Errorf("loadGenerateConfig = %+v, want %+v", g, want)
	}
}

func generateBase() map[string]string {
	return map[string]string{"SLUICE_BROKERS": "kafka:9092", "SLUICE_GENERATE_TOPIC": "numbers"}
}

var generateErrorTests = []configErrorTest{
	{"missing brokers", envWith(generateBase(), "SLUICE_BROKERS", "<unset>"), "SLUICE_BROKERS",
		"SLUICE_BROKERS is required: expected comma-separated seed brokers such as kafka:9092"},
	{"missing topic", envWith(generateBase(), "SLUICE_GENERATE_TOPIC", "<unset>"), "SLUICE_GENERATE_TOPIC",
		"SLUICE_GENERATE_TOPIC is required: expected a Kafka topic name"},
	{"bad topic", envWith(generateBase(), "SLUICE_GENERATE_TOPIC", "a b"), "SLUICE_GENERATE_TOPIC", ""},
	{"rate not an int", envWith(generateBase(), "SLUICE_GENERATE_RATE", "fast"), "SLUICE_GENERATE_RATE",
		`SLUICE_GENERATE_RATE="fast": expected an integer such as 3`},
	{"zero rate", envWith(generateBase(), "SLUICE_GENERATE_RATE", "0"), "SLUICE_GENERATE_RATE",
		`SLUICE_GENERATE_RATE="0": expected a number of records per second greater than 0`},
	{"keys not an int", envWith(generateBase(), "SLUICE_GENERATE_KEYS", "1e3"), "SLUICE_GENERATE_KEYS", ""},
	{"negative keys", envWith(generateBase(), "SLUICE_GENERATE_KEYS", "-1"), "SLUICE_GENERATE_KEYS", ""},
	{"typo", envWith(generateBase(), "SLUICE_GENERATE_RATES", "10"), "SLUICE_GENERATE_RATES", ""},
}

func savepointBase() map[string]string {
	return map[string]string{"SLUICE_BROKERS": "kafka:9092", "SLUICE_APP_ID": "orders", "SLUICE_SAVEPOINT_DIR": "/backups"}
}

var savepointErrorTests = []configErrorTest{
	{"missing dir", envWith(savepointBase(), "SLUICE_SAVEPOINT_DIR", "<unset>"), "SLUICE_SAVEPOINT_DIR",
		"SLUICE_SAVEPOINT_DIR is required: expected a directory path, file://path, s3://bucket/prefix?region=..., gs://bucket/prefix or azblob://container/prefix"},
	{"other scheme", envWith(savepointBase(), "SLUICE_SAVEPOINT_DIR", "abs://container/prefix"), "SLUICE_SAVEPOINT_DIR",
		`SLUICE_SAVEPOINT_DIR="abs://container/prefix": expected a directory path, file://path, s3://bucket/prefix?region=..., gs://bucket/prefix or azblob://container/prefix (savepoint: bad location: "abs://container/prefix": scheme abs:// is not supported (a path, file://path, s3://bucket/prefix, gs://bucket/prefix or azblob://container/prefix))`},
	{"unknown gs parameter", envWith(savepointBase(), "SLUICE_SAVEPOINT_DIR", "gs://bucket/prefix?regoin=x"), "SLUICE_SAVEPOINT_DIR", ""},
	{"unknown s3 parameter", envWith(savepointBase(), "SLUICE_SAVEPOINT_DIR", "s3://bucket/prefix?regoin=x"), "SLUICE_SAVEPOINT_DIR", ""},
	{"empty file URL", envWith(savepointBase(), "SLUICE_SAVEPOINT_DIR", "file://"), "SLUICE_SAVEPOINT_DIR", ""},
	{"missing app id", envWith(savepointBase(), "SLUICE_APP_ID", "<unset>"), "SLUICE_APP_ID", ""},
	{"bad app id", envWith(savepointBase(), "SLUICE_APP_ID", "a/b"), "SLUICE_APP_ID", ""},
	{"missing brokers", envWith(savepointBase(), "SLUICE_BROKERS", "<unset>"), "SLUICE_BROKERS", ""},
}

func TestSavepointConfig(t *testing.T) {
	for _, dir := range []string{"/backups", "file:///backups", "s3://bucket/prefix?region=eu-west-1&endpoint=http://127.0.0.1:9000&use_path_style=true", "gs://bucket/prefix?anonymous=true"} {
		c, err := loadSavepointConfig(envWith(savepointBase(), "SLUICE_SAVEPOINT_DIR", dir))
		if err != nil || c.Dir != dir || c.AppID != "orders" {
			t.Errorf("SLUICE_SAVEPOINT_DIR=%s: %+v, %v", dir, c, err)
		}
	}
	for _, tt := range savepointErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadSavepointConfig(tt.env)
			assertConfigError(t, err, tt.wantVar, tt.wantMsg)
		})
	}
}

func TestGenerateConfigErrors(t *testing.T) {
	for _, tt := range generateErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadGenerateConfig(tt.env)
			assertConfigError(t, err, tt.wantVar, tt.wantMsg)
		})
	}
	// The processor's variables may share an env file with the generator's.
	if _, err := loadGenerateConfig(envWith(generateBase(), "SLUICE_APP_ID", "x")); err != nil {
		t.Errorf("processor variable rejected by generate: %v", err)
	}
}

// TestConfigExampleEnvFiles loads every configs/*.env as `run` would, with
// the binary's own job table: a file for a job the binary does not have
// must say so in its first line ("# NOT BUILT YET"), and stops being
// accepted with that line once the job exists.
func TestConfigExampleEnvFiles(t *testing.T) {
	files, err := filepath.Glob("../../configs/*.env")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no configs/*.env")
	}
	jobsSeen := map[string]bool{}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			environ := readEnvFile(t, f)
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			notBuilt := strings.HasPrefix(string(b), "# NOT BUILT YET")
			job := environ["SLUICE_JOB"]
			jobsSeen[job] = true
			if want := job + ".env"; filepath.Base(f) != want {
				t.Errorf("%s runs job %s; name it %s", f, job, want)
			}
			c, err := loadConfig(environ, jobSpecs())
			if notBuilt {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Var != "SLUICE_JOB" {
					t.Fatalf("%s says its job is not built yet, but the processor accepts it (%v): drop the line", f, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := c.validateRun(); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, j := range jobSpecs() {
		if !jobsSeen[j.Name] {
			t.Errorf("no configs/%s.env example", j.Name)
		}
	}
}

// readEnvFile reads KEY=VALUE lines, skipping blanks and # comments: the
// subset that both `set -a; . file` and compose's env_file accept.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	environ := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.ContainsAny(v, "\"' ") {
			t.Fatalf("%s:%d: want KEY=VALUE without quotes or spaces, got %q", path, n, line)
		}
		environ[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return environ
}

// TestConfigNamesInDeployFiles catches a variable renamed in config.go but
// not in docker-compose.yml, the Dockerfile or configs/.
func TestConfigNamesInDeployFiles(t *testing.T) {
	files := []string{"../../docker-compose.yml", "../../Dockerfile"}
	err := filepath.WalkDir("../../configs", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`\bSLUICE_[A-Z0-9_]*[A-Z0-9]\b`)
	known := knownVars()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range name.FindAllString(string(b), -1) {
			if !slices.Contains(known, n) {
				t.Errorf("%s mentions %s, which is no variable", f, n)
			}
		}
	}
}
