package sluice

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kgoLogger forwards franz-go's log lines to slog: warn level and above as
// they come; its info lines, which are mostly per-request chatter, at debug
// level, but for the one an operator needs (unstableOffsets), which becomes
// the engine's own.
type kgoLogger struct {
	l        *slog.Logger
	unstable *unstableOffsets
}

func newKgoLogger(l *slog.Logger) kgoLogger {
	return kgoLogger{l: l, unstable: &unstableOffsets{now: time.Now}}
}

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelInfo
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
		lvl = slog.LevelWarn
	case kgo.LogLevelInfo:
		if msg == fetchOffsetsRetry {
			k.unstable.note(k.l, keyvals)
		}
		// The rest at debug level: assignments, transactions begun and
		// ended, metadata updates.
		lvl = slog.LevelDebug
	case kgo.LogLevelDebug:
		lvl = slog.LevelDebug
	}
	k.l.Log(context.Background(), lvl, msg, keyvals...)
}

// fetchOffsetsRetry is franz-go's info line for a partition newly assigned
// whose committed offset it may not read yet.
const fetchOffsetsRetry = "fetch offsets failed with retryable partition error, waiting 1s and retrying"

// unstableOffsets reports newly assigned partitions whose offset fetch the
// broker answers with UNSTABLE_OFFSET_COMMIT: a transaction that committed
// offsets for the group is still open (KIP-447), usually the previous
// owner's, which ends with its commit, its producer's fencing by a restart,
// or the transaction timeout. franz-go asks again every second, without
// end and at info level, naming the first partition refused (of a request
// built from a map: with several input topics, the one named changes);
// until it gets an answer none of the partitions is fetched, although
// their tasks are restored and /readyz says ready. A client runs one such
// fetch at a time, so its retries make one wait, whatever partition they
// name: its first retry is logged, and every tenth after it as a warning.
type unstableOffsets struct {
	now func() time.Time // time.Now; a test's clock

	mu          sync.Mutex
	since, seen time.Time // the wait's first retry and its last
	retries     int
}

// unstableGap is how long without a retry ends a wait: a retry after it
// starts a new one.
const unstableGap = 5 * time.Second

func (u *unstableOffsets) note(l *slog.Logger, keyvals []any) {
	var topic string
	var partition int32
	var err error
	for i := 0; i+1 < len(keyvals); i += 2 {
		switch keyvals[i] {
		case "topic":
			topic, _ = keyvals[i+1].(string)
		case "partition":
			partition, _ = keyvals[i+1].(int32)
		case "err":
			err, _ = keyvals[i+1].(error)
		}
	}
	if !errors.Is(err, kerr.UnstableOffsetCommit) {
		return // an unknown topic id: retried three times, then reported
	}
	now := u.now()
	u.mu.Lock()
	if now.Sub(u.seen) > unstableGap {
		u.since, u.retries = now, 0
	}
	u.seen = now
	u.retries++
	retries, since := u.retries, u.since
	u.mu.Unlock()
	switch {
	case retries == 1:
		l.Info("newly assigned partitions wait for an open transaction that committed offsets for the group (UNSTABLE_OFFSET_COMMIT); they are fetched once it ends",
			"topic", topic, "partition", partition)
	case retries%10 == 0:
		l.Warn("newly assigned partitions still wait for an open transaction that committed offsets for the group (UNSTABLE_OFFSET_COMMIT); it ends by its commit, its producer's fencing or its timeout",
			"topic", topic, "partition", partition, "waited", now.Sub(since).Round(time.Second).String())
	}
}
