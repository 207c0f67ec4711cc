package sluice

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The input consumer's bound on each partition's records in a fetch
// response (kgo.FetchMaxPartitionBytes): see docs/operations.md#fetch-size.

// fetchMaxPartitionBytes bounds each partition's records in the input
// consumer's fetch responses (newSession), times Options.Parallelism up
// to maxFetchParallelism (fetchPartitionBytes).
const fetchMaxPartitionBytes = 64 << 10

// maxFetchParallelism caps the multiple of fetchMaxPartitionBytes at
// 1 MiB, franz-go's default bound.
const maxFetchParallelism = 16

// fetchPartitionBytes is the input consumer's bound on each partition's
// records in a fetch response: fetchMaxPartitionBytes, times the tasks
// processed at once (Options.taskWorkers), up to franz-go's default of
// 1 MiB. Tasks processed in parallel need polls that hold several tasks'
// records, and a batch over the bound is returned only as the first of a
// response (KIP-74): a topic written in batches over 64 KiB then comes
// one batch, so one task, a poll, and the other workers have nothing to
// do. make bench's input is written so (BENCHMARKS.md, tasks in
// parallel): its hash job with 2 tasks at once went from a median of 1.16
// to about 1.45 times its records/s with one (alternated runs). Batches
// larger still raise the bound further (fetchBound).
func (in *Instance) fetchPartitionBytes() int32 {
	return int32(min(in.cfg.taskWorkers(), maxFetchParallelism) * fetchMaxPartitionBytes)
}

// recordBatchOverhead is a record batch's header: what a batch takes in a
// fetch response beyond the records kgo.FetchBatchMetrics.CompressedBytes
// counts.
const recordBatchOverhead = 61

// adaptsFetchBound says whether a poll must hold several partitions for
// the instance to work as meant: tasks processed in parallel need several
// tasks' records, and a task merging several input topics needs each
// topic's (copartition.go). Then the fetch bound follows the input's
// batches (fetchBound).
func (o *Options) adaptsFetchBound() bool {
	return o.taskWorkers() > 1 || len(o.InputTopics) > 1
}

// fetchBound raises the input consumer's bound on a partition's records in
// a fetch response to the largest record batch read, for an instance whose
// polls must hold several partitions (Options.adaptsFetchBound).
//
// A batch over the bound is returned only as the first of a response
// (KIP-74), so an input written in larger batches comes one batch, so one
// partition, a response. Tasks in parallel then have one task a poll to
// process; and a task merging two topics finds one of them missing from
// every poll, holds the other's records back for it (copartition.go), and
// fetches them again, until Options.MaxTaskIdle lets it go on without: two
// topics written in batches of 300 KB had each batch read some 90 times and
// the task stalled for a second before the bound followed the batches. Both
// happen with franz-go's producer, which writes batches of up to 1 MiB
// under load.
//
// The bound rises to the batch's size rounded up to a power of two, at
// most maxFetchBound and the response's bound (kgo.FetchMaxBytes). It
// never falls, since a topic's producers keep writing batches of about the
// same size, and it outlives the session, so a new session's client starts
// at what was learned. A bound set in Options.ClientOpts is left alone for
// the instance's life.
//
// franz-go reads the bound for every fetch request, but in a fetch session
// (KIP-227) a request names only the partitions whose position moved, and
// the broker keeps the bound it was given before for the others. Kafka
// moves a partition that returned records to the back of the session, so
// one still at the old bound soon comes first, is returned alone, and
// learns the new bound with its next position: a response or so per
// partition. kfake (`processor broker`, the tests) keeps the session's
// order, so a partition skipped once was skipped until the ones before it
// ran dry (found by review: every poll held one partition). So an instance
// that adapts the bound fetches without sessions (newSession), every
// request naming every partition with the bound, on any broker, at the
// cost of naming every partition in each request and response.
type fetchBound struct {
	// bound is what a new session asks for: the initial bound, or the
	// largest batch read since, rounded up.
	bound atomic.Int32
	// ceiling is what the bound may rise to: maxFetchBound, and at most
	// the client's bound on a whole response once one is attached; 0 for
	// good once Options.ClientOpts turn out to set the bound (a session's
	// client did not have the one asked for). Written under mu.
	ceiling atomic.Int32

	mu  sync.Mutex
	cl  *kgo.Client // the session's client the bound is applied to; nil: none yet
	max int32       // cl's bound on a whole response
}

// maxFetchBound caps what the bound is raised to: Kafka's and franz-go's
// default bound on a partition, and above the largest batch either
// producer writes by default (franz-go's ProducerBatchMaxBytes, Kafka's
// max.request.size). A topic written in larger batches still comes one
// batch a response; a response stays within partitions × 1 MiB, as any
// consumer's with the defaults.
const maxFetchBound = 1 << 20

func newFetchBound(initial int32) *fetchBound {
	f := &fetchBound{}
	f.bound.Store(initial)
	f.ceiling.Store(maxFetchBound)
	return f
}

// adapting reports whether the bound may still rise: Options.ClientOpts
// did not set it. A session of an instance whose bound is fixed keeps
// franz-go's defaults (fetch sessions, no hook).
func (f *fetchBound) adapting() bool { return f.ceiling.Load() > 0 }

// OnFetchBatchRead is franz-go's hook (kgo.HookFetchBatchRead), called on
// its fetch goroutines for every batch read, of the current session's
// client or of one closing.
func (f *fetchBound) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	need := int64(m.CompressedBytes) + recordBatchOverhead
	if b := f.bound.Load(); need <= int64(b) || b >= f.ceiling.Load() {
		return
	}
	f.raise(need)
}

// raise makes the bound at least need, rounded up to a power of two, and
// applies it to the session's client.
func (f *fetchBound) raise(need int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	next := int32(min(int64(1)<<bits.Len64(uint64(need-1)), int64(f.ceiling.Load())))
	if next <= f.bound.Load() {
		return
	}
	f.bound.Store(next)
	if f.cl != nil {
		f.cl.UpdateFetchMaxBytes(f.max, next)
	}
}

// attach applies the bound to cl, a new session's client built with
// asked. If cl has another bound (or, for an asked bound above the
// response's, another than the response's, to which franz-go lowers it),
// Options.ClientOpts set it, and it stays as set from then on. (One set
// to the very bound asked is taken for the instance's own until a later
// session asks for a raised one.)
// franz-go's OptValue reads the bounds without synchronisation; every
// write to them (UpdateFetchMaxBytes) is made under f.mu, as this read is.
func (f *fetchBound) attach(cl *kgo.Client, asked int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cl = nil
	if !f.adapting() {
		return
	}
	maxBytes, _ := cl.OptValue(kgo.FetchMaxBytes).(int32)
	if got, _ := cl.OptValue(kgo.FetchMaxPartitionBytes).(int32); got != min(asked, maxBytes) {
		f.ceiling.Store(0)
		return
	}
	f.cl, f.max = cl, maxBytes
	f.ceiling.Store(min(maxBytes, maxFetchBound))
	if b := min(f.bound.Load(), maxBytes); b > asked {
		cl.UpdateFetchMaxBytes(maxBytes, b)
	}
}
