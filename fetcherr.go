package sluice

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// fetchErrorEvery bounds how often the same error of the same partition is
// logged.
const fetchErrorEvery = time.Minute

// maxFetchErrorKeys bounds the errors remembered: errors whose text
// carries a count or an offset are each a key of their own.
const maxFetchErrorKeys = 1000

// fetchErrorKey is an error of a partition's; partition is -1 (and topic
// empty) for an error of the poll's as a whole.
type fetchErrorKey struct {
	topic     string
	partition int32
	err       string
}

// fetchErrorSeen is when an error was last logged, and how often it came
// since then without being logged.
type fetchErrorSeen struct {
	logged   time.Time
	unlogged int
}

// logFetchErrors logs the poll's errors that no other check acts on
// (pollDenied handles refused ACLs and credentials, duplicateInGroup a
// fenced instance id): a partition's fetch error franz-go does not retry
// by itself (an unknown server error, an unsupported compression, a batch
// that does not decode), during which the partition's task stands still;
// records of the input lost before they were consumed (kgo.ErrDataLoss:
// deleted or truncated, and the consumer went on from where the log is
// now); an error of the group's that franz-go injects
// (kgo.ErrGroupSession). franz-go goes on after each. The same error of
// the same partition is logged at most once a fetchErrorEvery, with how
// often it came since.
func (l *loop) logFetchErrors(fs kgo.Fetches) {
	fs.EachError(func(topic string, partition int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return // the poll's wait ended, or the session did
		}
		if l.fetchErrs == nil || len(l.fetchErrs) > maxFetchErrorKeys {
			l.fetchErrs = map[fetchErrorKey]*fetchErrorSeen{}
		}
		key := fetchErrorKey{topic, partition, err.Error()}
		seen := l.fetchErrs[key]
		if seen == nil {
			seen = &fetchErrorSeen{}
			l.fetchErrs[key] = seen
		}
		seen.unlogged++
		now := time.Now()
		if now.Sub(seen.logged) < fetchErrorEvery {
			return
		}
		times := seen.unlogged
		seen.logged, seen.unlogged = now, 0
		var lost *kgo.ErrDataLoss
		var group *kgo.ErrGroupSession
		switch {
		case errors.As(err, &lost):
			l.in.log.Error("input records were lost before they were consumed (deleted by retention or DeleteRecords, or truncated); consuming went on from where the log is now",
				"topic", topic, "partition", partition, "err", err, "times", times)
		case errors.As(err, &group):
			l.in.log.Warn("the consumer group reported an error; franz-go goes on", "err", err, "times", times)
		case topic == "":
			l.in.log.Warn("polling failed; franz-go goes on", "err", err, "times", times)
		default:
			l.in.log.Warn("fetching a partition failed; its task waits while the error lasts",
				"topic", topic, "partition", partition, "err", err, "times", times)
		}
	})
}
