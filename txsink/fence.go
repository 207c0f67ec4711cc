package txsink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrFenceTimeout is returned (wrapped) by Fence when the transaction
// coordinator kept answering "busy" until ctx ended.
var ErrFenceTimeout = errors.New("txsink: transactional id still busy")

// Fence initialises a producer id for txnID (InitProducerID), which bumps
// the id's epoch: any earlier producer with that id is fenced, and the
// coordinator aborts the transaction it left open. A restarted instance
// calls it before its restores begin, so a changelog partition held open
// by its own dangling transaction becomes readable at once instead of after
// the transaction timeout (restores wait for the last stable offset). The
// session's own producer initialises its id afterwards, bumping the epoch
// once more; that is harmless.
//
// The coordinator answers CONCURRENT_TRANSACTIONS while it completes the
// abort; Fence retries that (and coordinator moves, which the client
// handles) until ctx ends. Any other error is returned as it is.
func Fence(ctx context.Context, cl *kgo.Client, txnID string, timeout time.Duration) error {
	backoff := 20 * time.Millisecond
	for {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &txnID
		req.TransactionTimeoutMillis = int32(timeout / time.Millisecond)
		req.ProducerID, req.ProducerEpoch = -1, -1
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kerr.ConcurrentTransactions), kerr.IsRetriable(err) && ctx.Err() == nil:
		default:
			return fmt.Errorf("txsink: fence transactional id %q: %w", txnID, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %q: %w", ErrFenceTimeout, txnID, err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}
