package sluice_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// An open transaction that committed offsets for the group (a previous
// owner killed in its commit, before its transaction timed out) holds back
// the offset fetch of the instance given the partitions: the broker answers
// UNSTABLE_OFFSET_COMMIT (KIP-447), and franz-go asks again every second at
// info level. The instance says so in its log, and consumes every input
// once the transaction ends.
func TestUnstableOffsetsAreLoggedAndWaitedFor(t *testing.T) {
	const app = "unstable"
	brokers, adm := inputCluster(t, 4, nil)
	produceAggregateInput(t, brokers)

	// The open transaction: offsets for the group, committed in it, as a
	// member's TxnOffsetCommit would (generation -1: an admin's commit).
	// Pinned below TxnOffsetCommit v5, which adds the group to the
	// transaction itself, so AddOffsetsToTxn does it as Kafka 3.0 did.
	// Its timeout outlasts any wait of the test's: the broker must not end
	// it first.
	blocker, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(app+"-blocker"),
		kgo.TransactionTimeout(5*time.Minute), kgo.DefaultProduceTopic("out"), kgo.MaxVersions(kversion.V3_0_0()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(blocker.Close)
	ctx := context.Background()
	if err := blocker.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := blocker.ProduceSync(ctx, &kgo.Record{Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pid, epoch, err := blocker.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = app+"-blocker", pid, epoch, app
	addResp, err := add.RequestWith(ctx, blocker)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("AddOffsetsToTxn: %v", err)
	}
	commit := kmsg.NewPtrTxnOffsetCommitRequest()
	commit.TransactionalID, commit.Group, commit.ProducerID, commit.ProducerEpoch = app+"-blocker", app, pid, epoch
	commit.Generation, commit.MemberID = -1, ""
	ct := kmsg.NewTxnOffsetCommitRequestTopic()
	ct.Topic = "in"
	cp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	cp.Partition, cp.Offset = 0, 0
	ct.Partitions = append(ct.Partitions, cp)
	commit.Topics = append(commit.Topics, ct)
	commitResp, err := commit.RequestWith(ctx, blocker)
	for i := 0; err == nil && i < len(commitResp.Topics); i++ {
		for _, rp := range commitResp.Topics[i].Partitions {
			if err == nil {
				err = kerr.ErrorForCode(rp.ErrorCode)
			}
		}
	}
	if err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}

	var mu sync.Mutex
	var msgs []string
	logged := messages{mu: &mu, msgs: &msgs}
	state := filepath.Join(t.TempDir(), "s")
	opts := aggregateOptions(brokers, app, state)
	opts.Logger = slog.New(logged)
	r := startInstance(t, opts)
	const waits = "newly assigned partitions wait for an open transaction that committed offsets for the group (UNSTABLE_OFFSET_COMMIT); they are fetched once it ends"
	waitUntil(t, "the wait logged", func() bool { return slices.Contains(logged.all(), waits) })

	if err := blocker.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every input consumed", func() bool { return consumedAll(adm, app, applyKeys*applyPerKey)(r.inst) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	checkAggregations(t, state, app)
}
