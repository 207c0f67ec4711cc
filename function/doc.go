// Package function runs a job whose computation is a user's function in any
// language, served over the sidecar protocol (proto/sluice/function/v1,
// docs/sidecar.md): Sluice consumes, keeps the keyed state, fires the timers
// and commits the Kafka transactions; the function only computes, and the
// processor calls it.
//
// New asks the function to Describe itself, checks the answer, and returns a
// sluice.Job that the engine runs like any other:
//
//	job, err := function.New(ctx, function.Options{URL: "http://127.0.0.1:8080"})
//	inst, err := sluice.New(sluice.Options{Job: job, ...})
//
// The job uses the engine's Prefetch hook. For each polled batch of a task,
// Prefetch groups the records by key, reads each key's declared states, and
// calls Invoke for the keys, several calls in flight for disjoint keys
// (Options.Concurrency), at most Options.Batch records per call (a key with
// more is sent in consecutive calls, each with the state the previous one
// left). Process then applies each key's answer at the key's last record of
// the batch (state writes, outputs, timers), so it commits with the epoch
// exactly like an in-process job's effects; the key's earlier records do
// nothing. Timers, processing-time and (for a function that declares
// event_time) event-time ones, fire between polls, never inside a batch,
// and OnTimer makes one call for the timer's key.
//
// Failures: a function that cannot be reached makes the batch wait (see
// sluice.UnavailableError); a call that times out or fails, or a key
// answered RETRY, is retried with backoff up to Options.Retries; a key
// answered DEAD_LETTER, or out of retries, fails each of its records in the
// batch: to the dead-letter topic with sluice.stage=function, or, with
// Options.OnFailure = Fail, the instance stops. A key answered PARTIAL
// fails the records its result lists in the same way, and its result
// applies at its last record not listed.
//
// The subpackages: functionv1 is the generated protocol code; sdk is the
// small Go SDK (an http.Handler from a function value); the Python SDK is
// function/python/sluice_function.py.
package function
