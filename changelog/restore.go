package changelog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/kstate"
)

// RestoreParams says which changelog partition to restore and where to put it.
type RestoreParams struct {
	// Admin lists offsets and the group's committed offsets.
	Admin *kadm.Client
	// ClientOpts connect a direct (group-less) consumer: seed brokers, TLS,
	// logging. Restore adds the partition, read_committed and control
	// records itself.
	ClientOpts []kgo.Opt
	Topic      string
	Partition  int32
	// From is the backend's stored changelog offset: just past the last
	// epoch marker it applied.
	From int64
	// Group and InputTopics name the consumer group and the task's input
	// topics, for the check that the group's stable offsets agree with the
	// last marker. An empty Group skips the check.
	Group       string
	InputTopics []string
	// Applied, if set, is the last marker the backend applied (its epoch
	// and offsets), so a restore that finds nothing new still knows them.
	Applied *Marker
	// BatchKeys bounds how many distinct keys are held before applying;
	// the batch is cut only at a marker. Default 50,000.
	BatchKeys int
	// Apply writes a batch of complete epochs to the backend in one atomic
	// step, with the last marker and the changelog offset just past it.
	Apply func(muts []kstate.Mutation, last Marker, next int64) error
	// Progress, if set, is told the records read and the records that
	// remain to the partition's end.
	Progress func(done, remaining int64)
	// Logf, if set, receives notable events (waiting on an open
	// transaction, a group ahead of the changelog).
	Logf func(msg string, args ...any)
}

// Result is what a restore found.
type Result struct {
	Records int64   // changelog records read
	Last    *Marker // last complete epoch's marker, nil if the partition has none
	Next    int64   // changelog offset just past Last's marker (the next From)
}

// ErrGroupAhead is returned (wrapped) when the consumer group's committed
// offsets stay ahead of the changelog's last marker: an epoch committed its
// offsets without its state, which means the changelog topic was replaced
// or truncated under the app. Reset the app rather than guess.
var ErrGroupAhead = errors.New("changelog: consumer group offsets are ahead of the changelog")

// ErrStateAhead is returned (wrapped) when the local store says it applied
// changelog offsets past the partition's end: the changelog topic was
// deleted and recreated under a kept state directory. Delete the task's
// state file (or the whole state dir) to restore from the new changelog.
var ErrStateAhead = errors.New("changelog: local state is ahead of the changelog")

const (
	stableAttempts = 20
	idleLimit      = 5 * time.Second // far beyond a fetch round trip: a silent tail is one compaction removed
)

// Restore brings a backend up to date from its changelog partition. It reads
// read_committed from p.From and applies only complete epochs: records up to
// an epoch marker. It returns once nothing is still landing: the partition
// has no open transaction (last stable offset = high-water mark), it has been
// read to that end, and the group's committed offsets, fetched with KIP-447's
// require-stable, are not ahead of the last marker. A fenced zombie whose
// commit is still in flight when the partition moves shows up as an open
// transaction or an unstable offset; reading to the end too early would
// replay its epoch twice.
func Restore(ctx context.Context, p RestoreParams) (Result, error) {
	if p.BatchKeys <= 0 {
		p.BatchKeys = 50000
	}
	r := restorer{p: p, res: Result{Next: p.From, Last: p.Applied}, ready: map[string][]byte{}, pending: map[string][]byte{}}
	defer r.close()
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		end, err := r.stableEnd(ctx)
		if err != nil {
			return r.res, err
		}
		if p.From > end {
			return r.res, fmt.Errorf("%w: %s/%d stored offset %d, end %d", ErrStateAhead, p.Topic, p.Partition, p.From, end)
		}
		if err := r.readTo(ctx, end); err != nil {
			return r.res, err
		}
		ahead, err := r.groupAhead(ctx)
		if err != nil {
			// UNSTABLE_OFFSET_COMMIT outlasting the client's retries
			// means a transaction is still in flight: read again.
			r.logf("fetching the group's stable offsets failed; re-reading", "partition", p.Partition, "err", err)
			ahead = true
		}
		if !ahead {
			return r.res, r.flush()
		}
		if attempt >= stableAttempts {
			if err != nil {
				return r.res, err
			}
			return r.res, fmt.Errorf("%w: partition %d, last marker %+v", ErrGroupAhead, p.Partition, r.res.Last)
		}
		r.logf("consumer group offsets ahead of the changelog; re-reading", "partition", p.Partition)
		if err := sleep(ctx, backoff); err != nil {
			return r.res, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

type restorer struct {
	p   RestoreParams
	res Result
	cl  *kgo.Client
	pos int64 // next changelog offset to read

	// ready holds complete epochs not yet applied; pending the records of
	// the epoch whose marker has not been read yet.
	ready, pending map[string][]byte
	readyLast      *Marker
	readyNext      int64
}

func (r *restorer) logf(msg string, args ...any) {
	if r.p.Logf != nil {
		r.p.Logf(msg, args...)
	}
}

func (r *restorer) close() {
	if r.cl != nil {
		r.cl.Close()
	}
}

// stableEnd waits until the partition has no open transaction and returns
// its high-water mark.
func (r *restorer) stableEnd(ctx context.Context) (int64, error) {
	backoff := 50 * time.Millisecond
	for {
		hwm, err := r.listed(ctx, r.p.Admin.ListEndOffsets)
		if err != nil {
			return 0, err
		}
		lso, err := r.listed(ctx, r.p.Admin.ListCommittedOffsets)
		if err != nil {
			return 0, err
		}
		if lso >= hwm {
			return hwm, nil
		}
		r.logf("changelog partition has an open transaction; waiting for it to end", "partition", r.p.Partition, "lso", lso, "hwm", hwm)
		if err := sleep(ctx, backoff); err != nil {
			return 0, err
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (r *restorer) listed(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
	offs, err := list(ctx, r.p.Topic)
	if err != nil {
		return 0, fmt.Errorf("changelog: list offsets of %s: %w", r.p.Topic, err)
	}
	o, ok := offs.Lookup(r.p.Topic, r.p.Partition)
	if !ok {
		return 0, fmt.Errorf("changelog: %s has no partition %d", r.p.Topic, r.p.Partition)
	}
	if o.Err != nil {
		return 0, fmt.Errorf("changelog: list offsets of %s/%d: %w", r.p.Topic, r.p.Partition, o.Err)
	}
	return o.Offset, nil
}

// readTo consumes until the position reaches end. Control records (commit
// and abort markers) are kept so the position is seen to pass them.
func (r *restorer) readTo(ctx context.Context, end int64) error {
	if r.cl == nil {
		r.pos = r.p.From
		if r.pos >= end {
			return nil
		}
		opts := append([]kgo.Opt{}, r.p.ClientOpts...)
		opts = append(opts,
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.p.Topic: {r.p.Partition: kgo.NewOffset().At(r.pos)}}),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.KeepControlRecords(),
			kgo.FetchMaxBytes(64<<20),
		)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return fmt.Errorf("changelog: restore client: %w", err)
		}
		r.cl = cl
	}
	idleSince := time.Now()
	for r.pos < end {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := r.cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var fetchErr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				fetchErr = fmt.Errorf("changelog: fetch %s/%d: %w", t, p, err)
			}
		})
		if fetchErr != nil {
			return fetchErr
		}
		n := 0
		var err error
		fs.EachRecord(func(rec *kgo.Record) {
			n++
			if err == nil {
				err = r.add(rec)
			}
		})
		if err != nil {
			return err
		}
		if n > 0 {
			idleSince = time.Now()
		} else if time.Since(idleSince) > idleLimit {
			// Only records that compaction removed can lie between
			// here and the end: the last stable offset equals the
			// high-water mark, so nothing is in flight.
			r.logf("changelog restore idle below the end; treating the rest as compacted away", "partition", r.p.Partition, "position", r.pos, "end", end)
			r.pos = end
		}
		if r.p.Progress != nil {
			r.p.Progress(r.res.Records, max(0, end-r.pos))
		}
	}
	return nil
}

func (r *restorer) add(rec *kgo.Record) error {
	r.pos = rec.Offset + 1
	if rec.Attrs.IsControl() {
		return nil
	}
	r.res.Records++
	if IsMarker(rec.Key) {
		m, err := DecodeMarker(rec.Value)
		if err != nil {
			return fmt.Errorf("changelog: %s/%d offset %d: %w", rec.Topic, rec.Partition, rec.Offset, err)
		}
		for k, v := range r.pending {
			r.ready[k] = v
		}
		clear(r.pending)
		r.readyLast, r.readyNext = &m, rec.Offset+1
		if len(r.ready) >= r.p.BatchKeys {
			return r.flush()
		}
		return nil
	}
	if _, err := kstate.DecodeKey(rec.Key); err != nil {
		return fmt.Errorf("changelog: %s/%d offset %d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	// A nil value is a tombstone; keep it as nil so it deletes.
	r.pending[string(rec.Key)] = rec.Value
	return nil
}

// flush applies the complete epochs read so far in one backend step.
func (r *restorer) flush() error {
	if r.readyLast == nil {
		return nil
	}
	muts := make([]kstate.Mutation, 0, len(r.ready))
	for k, v := range r.ready {
		muts = append(muts, kstate.Mutation{Key: []byte(k), Value: v})
	}
	if err := r.p.Apply(muts, *r.readyLast, r.readyNext); err != nil {
		return fmt.Errorf("changelog: apply restored batch: %w", err)
	}
	r.res.Last, r.res.Next = r.readyLast, r.readyNext
	clear(r.ready)
	r.readyLast = nil
	return nil
}

// groupAhead reports whether the group's stable committed offsets for the
// task's input partitions are past the last marker read. RequireStable makes
// the broker answer only once no transactional offset commit is pending.
func (r *restorer) groupAhead(ctx context.Context) (bool, error) {
	if r.p.Group == "" {
		return false, nil
	}
	last := r.res.Last
	if r.readyLast != nil {
		last = r.readyLast
	}
	offs, err := r.p.Admin.FetchOffsetsForTopics(kadm.RequireStable(ctx), r.p.Group, r.p.InputTopics...)
	if err != nil {
		return false, fmt.Errorf("changelog: fetch stable offsets of group %s: %w", r.p.Group, err)
	}
	for _, t := range r.p.InputTopics {
		o, ok := offs.Lookup(t, r.p.Partition)
		if !ok || o.Err != nil || o.At < 0 {
			continue
		}
		var mine int64 = -1
		if last != nil {
			if v, ok := last.Offsets[t]; ok {
				mine = v
			}
		}
		if o.At > mine && (last != nil || o.At > 0) {
			r.logf("group committed offset ahead of changelog marker", "topic", t, "partition", r.p.Partition, "group", o.At, "marker", mine, "from", r.p.From, "position", r.pos, "records", r.res.Records)
			return true, nil
		}
	}
	return false, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
