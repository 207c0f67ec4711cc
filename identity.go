package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Two live processes with the same instance id share a static group
// membership and a transactional id: each start fences the other, forever.
// That is a configuration error no restart repairs, so the instance stops
// with a line that says so instead of rebuilding its session in a loop.

// ErrDuplicateInstance is returned (wrapped) by Run when another live
// process uses this instance's id.
var ErrDuplicateInstance = errors.New("another process uses this instance id")

// fencedSessionsLimit is how many sessions may end with a fenced producer
// within fencedWindow transaction timeouts before the instance concludes
// that another process holds its transactional id. One fencing is normal (a
// pause past the transaction timeout; the broker aborts and bumps the
// epoch); a process fenced again right after it fenced the other back is
// not. Two live processes fence each other every few seconds.
const (
	fencedSessionsLimit = 3
	fencedWindow        = 6
)

// duplicateInGroup looks in a poll's errors for the group refusing this
// static member because another one holds its group.instance.id:
// FENCED_INSTANCE_ID at once, or (KIP-848) UNRELEASED_INSTANCE_ID for
// longer than two session timeouts without this member joining in between.
// A crashed predecessor's membership is released by then (or taken over at
// start, see group.go); a live process's is not.
func (in *Instance) duplicateInGroup(fs kgo.Fetches, joined bool) error {
	if joined {
		in.unreleasedSince = time.Time{}
	}
	var dup error
	fs.EachError(func(_ string, _ int32, err error) {
		switch {
		case dup != nil:
		case errors.Is(err, kerr.FencedInstanceID):
			dup = fmt.Errorf("%w: the group fenced member %q (FENCED_INSTANCE_ID): give every instance its own SLUICE_INSTANCE_ID", ErrDuplicateInstance, in.cfg.InstanceID)
		case errors.Is(err, kerr.UnreleasedInstanceID):
			now := in.now()
			if in.unreleasedSince.IsZero() {
				in.unreleasedSince = now
			} else if now.Sub(in.unreleasedSince) > 2*in.cfg.SessionTimeout {
				dup = fmt.Errorf("%w: the group has refused member %q for %s (UNRELEASED_INSTANCE_ID): give every instance its own SLUICE_INSTANCE_ID",
					ErrDuplicateInstance, in.cfg.InstanceID, now.Sub(in.unreleasedSince).Round(time.Second))
			}
		}
	})
	return dup
}

// isFenced reports whether a session ended because its producer was fenced.
func isFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.FencedInstanceID)
}
