package txsink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Session is one group membership's consumer and producer. Every method but
// Close must be called from the one goroutine that polls; Close may be
// called once, by that goroutine, after its last use.
type Session interface {
	// Client is the underlying client, for pausing partitions and setting
	// offsets. Do not end transactions through it.
	Client() *kgo.Client
	// PollRecords polls at most n records. Rebalances stay blocked until
	// AllowRebalance.
	PollRecords(ctx context.Context, n int) kgo.Fetches
	// AllowRebalance lets a pending rebalance run during the next poll.
	AllowRebalance()
	// Begin opens the epoch's transaction (a no-op at-least-once).
	Begin() error
	// Produce buffers r for the open epoch; promise is called once with
	// its outcome.
	Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
	// End finishes the epoch. With commit set, it flushes everything
	// produced and commits offsets with it; it reports whether the epoch
	// committed. Exactly-once commits the consumer's positions (the caller
	// makes them equal offsets first); at-least-once commits offsets as
	// given. Without commit, or when the commit is refused (a rebalance
	// took partitions), the epoch is aborted and the consumer rewound to
	// the committed offsets. A non-nil error means the session cannot be
	// used again: Close it and build a new one.
	End(ctx context.Context, commit bool, offsets map[string]map[int32]kgo.EpochOffset) (committed bool, err error)
	// Close leaves the session; buffered, uncommitted records are dropped.
	Close()
}

// ErrProduce is returned (wrapped) by End when a record of the epoch failed
// to produce; the epoch is then not committed.
var ErrProduce = errors.New("txsink: produce failed")

// NewExactlyOnce builds a transactional session. opts must configure the
// consumer group, the transactional ID and BlockRebalanceOnPoll.
func NewExactlyOnce(opts ...kgo.Opt) (Session, error) {
	s, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return nil, fmt.Errorf("txsink: %w", err)
	}
	return &exactlyOnce{s: s}, nil
}

type exactlyOnce struct {
	s *kgo.GroupTransactSession
	// tv2 caches whether the brokers run transactions version 2 (KIP-890
	// part 2), where TxnOffsetCommit adds the group to the transaction by
	// itself; nil until an epoch first needs to know.
	tv2 *bool
	// topicIDs caches the input topics' ids, which TxnOffsetCommit v6+
	// (KIP-1319) identifies topics by.
	topicIDs map[string][16]byte
}

func (e *exactlyOnce) Client() *kgo.Client { return e.s.Client() }
func (e *exactlyOnce) PollRecords(ctx context.Context, n int) kgo.Fetches {
	return e.s.PollRecords(ctx, n)
}
func (e *exactlyOnce) AllowRebalance() { e.s.AllowRebalance() }
func (e *exactlyOnce) Begin() error    { return e.s.Begin() }
func (e *exactlyOnce) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	e.s.Produce(ctx, r, promise)
}

// End ends the transaction. The session flushes before TxnOffsetCommit and
// EndTxn, so the changelog records and markers are durable in the open
// transaction before it commits; a revoke or a lost partition since Begin
// turns a commit into an abort (GroupTransactSession's rule (b)).
//
// An epoch that consumed nothing but still produced (timers fired, expired
// state swept) is ended by endUnconsumed instead; offsets are then the
// tasks' unchanged positions.
func (e *exactlyOnce) End(ctx context.Context, commit bool, offsets map[string]map[int32]kgo.EpochOffset) (bool, error) {
	if commit && len(offsets) > 0 && len(e.s.Client().UncommittedOffsets()) == 0 {
		return e.endUnconsumed(ctx, offsets)
	}
	return e.s.End(ctx, kgo.TransactionEndTry(commit))
}

// endUnconsumed commits an epoch that consumed no record. For such an epoch
// GroupTransactSession.End sends no TxnOffsetCommit, so nothing would check
// that this member still owns the partitions: a member that lost them
// while it was paused (a zombie) would commit the effects of timers its
// successor fires as well. So the tasks' unchanged offsets are committed in
// the transaction here, and the group coordinator checks the member id,
// generation (or member epoch) and instance id, as for any epoch: a zombie
// is refused and the epoch aborts. (Ending through the session would also
// hold the session's lock for 500 ms after the commit, for want of knowing
// the broker supports KIP-447, which throttled timer-only epochs to two a
// second.)
//
// The session's revoked and lost flags are not reset here, as its own End
// would: a revoke or loss always reaches the engine as a rebalance event,
// whose handling aborts the epoch through End(false), which resets them.
func (e *exactlyOnce) endUnconsumed(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (bool, error) {
	cl := e.s.Client()
	if err := cl.Flush(ctx); err != nil {
		return false, err
	}
	commitErr := e.commitOffsets(ctx, offsets)
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commitErr == nil)); err != nil {
		return false, err
	}
	return commitErr == nil, nil
}

// commitOffsets adds offsets to the open transaction with a TxnOffsetCommit
// carrying the member's identity, as GroupTransactSession does.
func (e *exactlyOnce) commitOffsets(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) error {
	cl := e.s.Client()
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	txnID, _ := cl.OptValue(kgo.TransactionalID).(string)
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	tv2, err := e.transactionsV2(ctx)
	if err != nil {
		return err
	}
	if !tv2 {
		add := kmsg.NewPtrAddOffsetsToTxnRequest()
		add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, group
		resp, err := add.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			return fmt.Errorf("txsink: AddOffsetsToTxn: %w", err)
		}
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = txnID, group, id, epoch
	req.MemberID, req.Generation = cl.GroupMetadata()
	if instance, ok := cl.OptValue(kgo.InstanceID).(string); ok && instance != "" {
		req.InstanceID = &instance
	}
	ids, err := e.topicIDsOf(ctx, offsets)
	if err != nil {
		return err
	}
	for topic, ps := range offsets {
		rt := kmsg.NewTxnOffsetCommitRequestTopic()
		rt.Topic, rt.TopicID = topic, ids[topic]
		for p, eo := range ps {
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, eo.Epoch
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("txsink: TxnOffsetCommit: %w", err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				if errors.Is(err, kerr.UnknownTopicID) {
					e.topicIDs = nil // recreated: look again next time
				}
				return fmt.Errorf("txsink: TxnOffsetCommit %s/%d: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}

// topicIDsOf returns the ids of the topics in offsets, from a metadata
// request the first time.
func (e *exactlyOnce) topicIDsOf(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (map[string][16]byte, error) {
	missing := false
	for topic := range offsets {
		if _, ok := e.topicIDs[topic]; !ok {
			missing = true
		}
	}
	if !missing {
		return e.topicIDs, nil
	}
	req := kmsg.NewPtrMetadataRequest()
	for topic := range offsets {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, e.s.Client())
	if err != nil {
		return nil, fmt.Errorf("txsink: metadata: %w", err)
	}
	if e.topicIDs == nil {
		e.topicIDs = map[string][16]byte{}
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("txsink: metadata of %s: %w", *t.Topic, err)
		}
		e.topicIDs[*t.Topic] = t.TopicID
	}
	return e.topicIDs, nil
}

// transactionsV2 reports whether the cluster finalized transaction.version
// 2 and takes TxnOffsetCommit v5, franz-go's own test for leaving out
// AddOffsetsToTxn.
func (e *exactlyOnce) transactionsV2(ctx context.Context) (bool, error) {
	if e.tv2 != nil {
		return *e.tv2, nil
	}
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, e.s.Client())
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return false, fmt.Errorf("txsink: ApiVersions: %w", err)
	}
	tv2 := false
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" && f.MaxVersionLevel >= 2 {
			tv2 = true
		}
	}
	if tv2 {
		tv2 = false
		for _, k := range resp.ApiKeys {
			if k.ApiKey == int16(kmsg.TxnOffsetCommit) && k.MaxVersion >= 5 {
				tv2 = true
			}
		}
	}
	e.tv2 = &tv2
	return tv2, nil
}
func (e *exactlyOnce) Close() { e.s.Close() }

// NewAtLeastOnce builds an idempotent, non-transactional session. opts must
// configure the consumer group with DisableAutoCommit and
// BlockRebalanceOnPoll.
func NewAtLeastOnce(opts ...kgo.Opt) (Session, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("txsink: %w", err)
	}
	return &atLeastOnce{cl: cl}, nil
}

type atLeastOnce struct {
	cl *kgo.Client
}

func (a *atLeastOnce) Client() *kgo.Client { return a.cl }
func (a *atLeastOnce) PollRecords(ctx context.Context, n int) kgo.Fetches {
	return a.cl.PollRecords(ctx, n)
}
func (a *atLeastOnce) AllowRebalance() { a.cl.AllowRebalance() }
func (a *atLeastOnce) Begin() error    { return nil }
func (a *atLeastOnce) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	a.cl.Produce(ctx, r, promise)
}

// End flushes everything produced, then commits offsets: exactly those
// given, never whatever else the consumer has polled. A crash between the
// two replays the epoch: at-least-once.
func (a *atLeastOnce) End(ctx context.Context, commit bool, offsets map[string]map[int32]kgo.EpochOffset) (bool, error) {
	if !commit {
		a.cl.SetOffsets(a.cl.CommittedOffsets())
		return false, nil
	}
	if err := a.cl.Flush(ctx); err != nil {
		return false, fmt.Errorf("txsink: flush: %w", err)
	}
	if len(offsets) == 0 {
		return true, nil
	}
	var commitErr error
	a.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			commitErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil && commitErr == nil {
					commitErr = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err)
				}
			}
		}
	})
	// The outputs are out and the offsets maybe not: replaying the epoch
	// is allowed at-least-once, so the session stays usable.
	return commitErr == nil, nil
}
func (a *atLeastOnce) Close() { a.cl.Close() }
