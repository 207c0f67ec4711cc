package sluice_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluicehq/sluice/internal/check"
)

// A partition's fetch error that franz-go does not retry by itself (here
// UNKNOWN_SERVER_ERROR, from the broker for the input's first fetches)
// comes back in the poll; the instance logs it, and once the broker
// answers again every input reaches the state once. It was dropped
// without a word: a partition that kept failing stood still silently.
func TestFetchErrorsAreLogged(t *testing.T) {
	const app, failing = "fetch-errors", 3
	c, adm := pipelinedCluster(t)
	brokers := c.ListenAddrs()
	produceAggregateInput(t, brokers)
	topics, err := adm.ListTopics(context.Background(), "in")
	if err != nil || topics.Error() != nil {
		t.Fatalf("list topics: %v %v", err, topics.Error())
	}
	in := topics["in"].ID

	// The input's fetches are answered with the error for every partition,
	// failing times; the changelog's (restores) are left alone.
	var failed atomic.Int32
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.FetchRequest)
		if !slices.ContainsFunc(req.Topics, func(rt kmsg.FetchRequestTopic) bool { return rt.Topic == "in" || rt.TopicID == in }) {
			c.KeepControl()
			return nil, nil, false
		}
		if failed.Add(1) > failing {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		return check.FetchError(kreq, kerr.UnknownServerError), nil, true
	})

	state := filepath.Join(t.TempDir(), "s")
	opts := aggregateOptions(brokers, app, state)
	var mu sync.Mutex
	var msgs []string
	logged := messages{mu: &mu, msgs: &msgs}
	opts.Logger = slog.New(logged)
	r := startInstance(t, opts)
	waitUntil(t, "the fetch error logged", func() bool {
		return slices.Contains(logged.all(), "fetching a partition failed; its task waits while the error lasts")
	})
	waitUntil(t, "every input consumed", func() bool { return consumedAll(adm, app, applyKeys*applyPerKey)(r.inst) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := failed.Load(); n <= failing {
		t.Fatalf("%d fetches of the input, want more than the %d failed", n, failing)
	}
	checkAggregations(t, state, app)
}
