// Package kstate owns Sluice's state: the typed state API that jobs use, the
// codecs, the physical key format shared with the changelog, the epoch
// write-set overlay, and the storage backends (memory and bbolt).
//
// It knows nothing about Kafka. The engine drives it; the changelog package
// ships its write-sets and replays them; neither concern leaks in here.
//
// # Layers
//
// A task's state is a Backend (durable, one per task) under a Store (the
// record's write-set, the epoch's, and while the last committed epoch is
// being written to the backend, that epoch's). Keyed state descriptors
// such as Value and Map read and write through a Scope, which names the
// Store, the current record key and the processing clock:
//
//	descriptor (Value, List, Map, Reducing, Aggregating, timers)
//	    │  Scope: Store + record key + clock
//	Store ── record write-set ── epoch write-set ── committed write-set (ApplyBehind, until Settle)
//	    │
//	Backend (memory | bbolt)
//
// # The engine's loop
//
// One goroutine owns a task's Store and does, per epoch:
//
//	for each record:
//	    err := process(record)       // reads and writes state via a Scope
//	    if err == nil { err = st.RecordErr() }
//	    if err != nil { st.RollbackRecord() } else { st.CommitRecord() }
//	at the barrier:
//	    cursor, _, err = kstate.SweepExpired(st, now, cursor, limit) // bounded; deletes join the epoch
//	    muts := st.Dirty()           // produce to the changelog, then the marker
//	    commit the Kafka transaction
//	    if committed { st.ApplyBehind(muts, meta, start) } else { st.Discard(); rewind inputs }
//	    // (or st.Apply(muts, meta), which waits for the write; the next
//	    // ApplyBehind, Apply or scan settles a write behind first)
//
// The order is the exactly-once argument: the backend changes only after
// the transaction that made the change visible has committed, in one
// atomic backend transaction together with the input offsets it
// corresponds to. An aborted epoch therefore leaves nothing to repair.
//
// # Physical keys
//
// Every entry is keyed [FormatV1][kind][name][record key][tail] (see
// EncodeKey), and the same bytes key the backend entry and the changelog
// record. The kind comes second, so each kind is one contiguous range:
//
//	KindKeyed     keyed state; the value is the codec's bytes
//	KindKeyedTTL  keyed state declared WithTTL; the value is an 8-byte
//	              big-endian expiry (unix ms), then the codec's bytes
//	KindTimer     a registered timer; the tail is domain, time and key
//	KindOperator  per-task operator state
//	KindMarker    the changelog's epoch marker, never a backend entry
//
// That the key says whether the value carries an expiry is what lets
// SweepExpired remove expired entries without knowing the job's
// descriptors, and walk only the entries that can expire.
//
// # Declaring state
//
// Descriptors are declared once, usually as package variables of a job, and
// used with whatever Scope the runtime passes:
//
//	var count = kstate.Value("count", kstate.Int64())
//
//	n, _, err := count.Get(ctx)
//	err = count.Set(ctx, n+1)
//
// State names are the identity of state in the backend and the changelog:
// keep them unique within a job and stable across releases.
package kstate
