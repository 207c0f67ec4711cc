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
// Produce and Begin must be called from the one goroutine that polls; Close
// may be called once, by that goroutine, after its last use. Produce and
// Begin may also be called from other goroutines while that one waits for
// them (the engine's parallel tasks): never at the same time as PollRecords
// or End, and Begin once per transaction, before any Produce to it.
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
	// the committed offsets (where consuming began, in a partition without
	// one). A non-nil error means the session cannot be
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
// state swept) has no uncommitted offsets, and the session would then send
// no TxnOffsetCommit: nothing would check that this member still belongs
// to the group, so one that lost its partitions while paused (a zombie)
// would commit the effects of timers its successor fires as well. (The
// session would also hold its lock for 500 ms after such a commit, for
// want of knowing the broker supports KIP-447.) For such an epoch offsets
// holds the tasks' unchanged positions, and they are added to the session's
// own TxnOffsetCommit (kgo.PreTxnCommitFnContext), which then carries the
// member id, generation and instance id as for any epoch. Everything else
// stays the session's: the abort after a revoke or loss during the epoch,
// AddOffsetsToTxn or transactions v2, retries, its flags.
func (e *exactlyOnce) End(ctx context.Context, commit bool, offsets map[string]map[int32]kgo.EpochOffset) (bool, error) {
	if commit && len(offsets) > 0 && len(e.s.Client().UncommittedOffsets()) == 0 {
		ctx = CommitOffsetsAs(ctx, offsets)
	}
	return e.s.End(ctx, kgo.TransactionEndTry(commit))
}

// CommitOffsetsAs makes the TxnOffsetCommit of a transaction ended under
// ctx carry exactly offsets, in place of the consumer's positions (through
// kgo.PreTxnCommitFnContext): those of an epoch that consumed nothing (see
// End), or of an epoch committed while the next one is already being
// polled (the engine's pipelined epochs). A partition whose offset is the
// one the session would commit keeps the leader epoch the session knows.
func CommitOffsetsAs(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) context.Context {
	return kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
		known := map[string]map[int32]kmsg.TxnOffsetCommitRequestTopicPartition{}
		for _, rt := range req.Topics {
			known[rt.Topic] = map[int32]kmsg.TxnOffsetCommitRequestTopicPartition{}
			for _, rp := range rt.Partitions {
				known[rt.Topic][rp.Partition] = rp
			}
		}
		req.Topics = req.Topics[:0]
		for topic, ps := range offsets {
			rt := kmsg.NewTxnOffsetCommitRequestTopic()
			rt.Topic = topic
			for p, eo := range ps {
				rp, ok := known[topic][p]
				if !ok || rp.Offset != eo.Offset {
					rp = kmsg.NewTxnOffsetCommitRequestTopicPartition()
					rp.Partition, rp.Offset, rp.LeaderEpoch = p, eo.Offset, eo.Epoch
				}
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
		}
		return nil
	})
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
	// began is where consuming began in each partition polled: an abort
	// rewinds a partition the group has no commit for to it, as franz-go's
	// transactional session does. The group's commits know nothing of such
	// a partition, and a rewind to them alone left the consumer past
	// records an abort dropped (a chaos run lost the first 120 inputs of a
	// partition).
	began map[string]map[int32]kgo.EpochOffset
}

func (a *atLeastOnce) Client() *kgo.Client { return a.cl }
func (a *atLeastOnce) PollRecords(ctx context.Context, n int) kgo.Fetches {
	fs := a.cl.PollRecords(ctx, n)
	fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
		if len(ftp.Records) == 0 {
			return
		}
		if _, ok := a.began[ftp.Topic][ftp.Partition]; !ok {
			a.began = withOffset(a.began, ftp.Topic, ftp.Partition, kgo.EpochOffset{Epoch: -1, Offset: ftp.Records[0].Offset})
		}
	})
	return fs
}

// rewindTo is where an abort places the consumer: the group's committed
// offsets, and where consuming began in partitions without one. A
// partition that is no longer consumed is skipped by SetOffsets.
func (a *atLeastOnce) rewindTo() map[string]map[int32]kgo.EpochOffset {
	at := a.cl.CommittedOffsets()
	for topic, ps := range a.began {
		for p, began := range ps {
			if _, ok := at[topic][p]; !ok {
				at = withOffset(at, topic, p, began)
			}
		}
	}
	return at
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
		a.cl.SetOffsets(a.rewindTo())
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

// withOffset sets m[topic][p] to o, making the maps it needs, and returns m.
func withOffset(m map[string]map[int32]kgo.EpochOffset, topic string, p int32, o kgo.EpochOffset) map[string]map[int32]kgo.EpochOffset {
	if m == nil {
		m = map[string]map[int32]kgo.EpochOffset{}
	}
	if m[topic] == nil {
		m[topic] = map[int32]kgo.EpochOffset{}
	}
	m[topic][p] = o
	return m
}
