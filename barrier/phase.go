package barrier

import "strconv"

// Phase is where the Coordinator is in the epoch protocol.
type Phase int

const (
	// Processing: tasks process records of the current epoch; no
	// checkpoint is in flight.
	Processing Phase = iota
	// Aligning: ActEndEpoch was returned; waiting for TaskReady from every
	// task it named.
	Aligning
	// Committing: ActCommit was returned; waiting for CommitDone or
	// CommitFailed.
	Committing
	// Applying: ActApply was returned; waiting for Applied.
	Applying
	// Aborting: ActAbort was returned; waiting for Aborted.
	Aborting
	// Failed: ActFail was returned. Terminal.
	Failed
	// Done: the final checkpoint after RequestShutdown completed (or there
	// was nothing left to commit). Terminal for the protocol: only Tick,
	// RequestShutdown and RequestRevoke are still accepted, as no-ops.
	Done
)

var phaseNames = [...]string{
	Processing: "processing",
	Aligning:   "aligning",
	Committing: "committing",
	Applying:   "applying",
	Aborting:   "aborting",
	Failed:     "failed",
	Done:       "done",
}

func (p Phase) String() string {
	if p >= 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "Phase(" + strconv.Itoa(int(p)) + ")"
}
