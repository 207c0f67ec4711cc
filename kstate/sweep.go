package kstate

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// SweepExpired deletes expired entries of state declared WithTTL, a bounded
// share of them per call, so that the entries of keys never read again do
// not stay in the backend and the changelog forever. The engine calls it
// once per epoch per task, carrying the cursor from one call to the next.
//
// It examines at most limit entries of KindKeyedTTL, in ascending key
// order, starting at the first key >= cursor (nil: from the beginning), as
// the Store sees them: write-sets included, so a value written or refreshed
// earlier in the epoch counts with its new expiry, and one deleted earlier
// is not there. An entry whose expiry is at or before now (in unix
// milliseconds, the rule reads apply) is deleted. now must come from the
// same processing-time clock as the task's Scopes. The expiry is read from
// the value, not from a descriptor, so entries of a state the job no
// longer declares are removed too.
//
// next is the cursor for the following call: the key of the first entry
// not examined, or nil when the sweep reached the end, so that the
// following call starts over. Entries written behind the cursor are met in
// the next round. removed counts the entries deleted.
//
// Call it between records, with no record in flight: it commits its
// deletes to the epoch write-set itself (CommitRecord), so they reach the
// changelog as tombstones and the backend when the epoch commits, and an
// aborted epoch drops them like any other write. With a record in flight
// it returns an error and does nothing, rather than commit that record's
// writes with its own.
//
// The cost is bounded by limit, not by the size of the state: one seek in
// each level of the Store, then limit entries plus the one that becomes
// next (and any deletes of this epoch in that range, which the merge
// passes over).
//
// A value too short to hold the expiry is corruption: SweepExpired returns
// an error wrapping ErrCorrupt that names the key. On any error it deletes
// nothing, the Store is as it was, and next is cursor, so a caller that
// keeps next keeps its place.
func SweepExpired(st *Store, now time.Time, cursor []byte, limit int) (next []byte, removed int, err error) {
	if limit < 1 {
		return cursor, 0, fmt.Errorf("kstate: SweepExpired: limit %d, want at least 1", limit)
	}
	if st.recordInFlight() {
		return cursor, 0, errRecordInFlight
	}
	nowMs := now.UnixMilli()
	examined := 0
	err = st.ScanFrom(kindPrefix(KindKeyedTTL), cursor, func(k, v []byte) error {
		if examined == limit {
			next = bytes.Clone(k)
			return ErrStopScan
		}
		examined++
		if len(v) < ttlHeaderLen {
			return fmt.Errorf("kstate: SweepExpired: %s: %w", describeKey(k), errShortTTL(len(v)))
		}
		if ttlExpiry(v) <= nowMs {
			// The scan goes on over the state as it was (see
			// Store.ScanFrom), so deleting under it is safe.
			st.Delete(k)
			removed++
		}
		return nil
	})
	if err == nil {
		err = st.recordErr
	}
	if err != nil {
		st.RollbackRecord()
		return cursor, 0, err
	}
	st.CommitRecord()
	return next, removed, nil
}

var errRecordInFlight = errors.New("kstate: called with a record in flight (neither committed nor rolled back); SweepExpired, Rewrite and Apply run between records")

// kindPrefix returns the prefix shared by every physical key of kind.
func kindPrefix(kind Kind) []byte { return []byte{FormatV1, byte(kind)} }

// describeKey names a physical key in an error message: its kind, state
// and record key (and map key, if any) when it decodes, its bytes
// otherwise.
func describeKey(k []byte) string {
	d, err := DecodeKey(k)
	if err != nil {
		return fmt.Sprintf("key %x", k)
	}
	s := fmt.Sprintf("%v state %q, record key %q", d.Kind, d.Name, d.UserKey)
	if d.Sub != nil {
		s += fmt.Sprintf(", map key %q", d.Sub)
	}
	return s
}
