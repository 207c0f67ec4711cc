package sluice

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// levels is a slog.Handler that keeps each record's level and message.
type levels struct {
	mu   sync.Mutex
	recs []string
}

func (h *levels) Enabled(context.Context, slog.Level) bool { return true }
func (h *levels) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Level.String()+" "+r.Message)
	return nil
}
func (h *levels) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *levels) WithGroup(string) slog.Handler      { return h }

func (h *levels) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	recs := h.recs
	h.recs = nil
	return recs
}

// franz-go's lines reach slog at their level, its info lines at debug;
// its retry of an offset fetch refused as unstable becomes the engine's
// info line at the first retry of a wait and a warning at every tenth, for
// that error only.
func TestKgoLoggerLevels(t *testing.T) {
	h := &levels{}
	k := newKgoLogger(slog.New(h))
	now := time.Unix(0, 0)
	k.unstable.now = func() time.Time { return now }
	if k.Level() != kgo.LogLevelInfo {
		t.Fatalf("level %v: franz-go would not send its info lines", k.Level())
	}
	k.Log(kgo.LogLevelError, "e")
	k.Log(kgo.LogLevelWarn, "w")
	k.Log(kgo.LogLevelInfo, "i")
	if got, want := h.take(), []string{"ERROR e", "WARN w", "DEBUG i"}; !slices.Equal(got, want) {
		t.Fatalf("logged %q, want %q", got, want)
	}

	retry := func(p int32, err error) {
		k.Log(kgo.LogLevelInfo, fetchOffsetsRetry, "group", "g", "topic", "in", "partition", p, "err", err)
	}
	raw := "DEBUG " + fetchOffsetsRetry
	retry(0, kerr.UnknownTopicID)
	if got, want := h.take(), []string{raw}; !slices.Equal(got, want) {
		t.Fatalf("an unknown topic id's retry: logged %q, want %q", got, want)
	}
	const waits = "INFO newly assigned partitions wait for an open transaction that committed offsets for the group (UNSTABLE_OFFSET_COMMIT); they are fetched once it ends"
	const still = "WARN newly assigned partitions still wait for an open transaction that committed offsets for the group (UNSTABLE_OFFSET_COMMIT); it ends by its commit, its producer's fencing or its timeout"
	for i := 1; i <= 20; i++ {
		now = now.Add(time.Second)
		retry(0, kerr.UnstableOffsetCommit)
		got := h.take()
		want := []string{raw}
		switch i {
		case 1:
			want = []string{waits, raw}
		case 10, 20:
			want = []string{still, raw}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("retry %d: logged %q, want %q", i, got, want)
		}
	}
	// A retry that names another partition (another input topic's, say)
	// goes on with the same wait; one after a pause of over unstableGap
	// starts a new wait.
	retry(1, kerr.UnstableOffsetCommit)
	if got, want := h.take(), []string{raw}; !slices.Equal(got, want) {
		t.Fatalf("a retry naming another partition: logged %q, want %q", got, want)
	}
	now = now.Add(unstableGap + time.Second)
	retry(1, kerr.UnstableOffsetCommit)
	if got, want := h.take(), []string{waits, raw}; !slices.Equal(got, want) {
		t.Fatalf("a retry after a pause: logged %q, want %q", got, want)
	}
}
