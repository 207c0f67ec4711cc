package sluice

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Errors a poll returns that no other check acts on: a partition's fetch
// error franz-go does not retry by itself (an unknown server error, an
// unsupported compression, a batch that does not decode), or an error of
// the group's that it injects into the poll. franz-go goes on fetching;
// the partition's task stands still while the error lasts. pollDenied
// handles refused ACLs and credentials, duplicateInGroup a fenced
// instance id; the rest was dropped, so a partition that kept failing
// stood still without a word. It is logged now, at most once a
// fetchErrorEvery for the same partition and error, with how often it
// came since.

// fetchErrorEvery bounds how often the same partition's same error is
// logged.
const fetchErrorEvery = time.Minute

// fetchErrorKey is a partition's error; topic is empty for the group's.
type fetchErrorKey struct {
	topic     string
	partition int32
	err       string
}

// fetchErrorSeen is when a partition's error was last logged, and how
// often it came since.
type fetchErrorSeen struct {
	logged time.Time
	since  int
}

// logFetchErrors logs the poll's errors (see above).
func (l *loop) logFetchErrors(fs kgo.Fetches) {
	fs.EachError(func(topic string, partition int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return // the poll's wait ended, or the session did
		}
		if l.fetchErrs == nil || len(l.fetchErrs) > 1000 {
			l.fetchErrs = map[fetchErrorKey]*fetchErrorSeen{}
		}
		key := fetchErrorKey{topic, partition, err.Error()}
		seen := l.fetchErrs[key]
		if seen == nil {
			seen = &fetchErrorSeen{}
			l.fetchErrs[key] = seen
		}
		seen.since++
		now := time.Now()
		if now.Sub(seen.logged) < fetchErrorEvery {
			return
		}
		if topic == "" {
			l.in.log.Warn("the consumer group reported an error; franz-go goes on", "err", err, "times", seen.since)
		} else {
			l.in.log.Warn("fetching a partition failed; its task waits while the error lasts", "topic", topic, "partition", partition, "err", err, "times", seen.since)
		}
		seen.logged, seen.since = now, 0
	})
}
