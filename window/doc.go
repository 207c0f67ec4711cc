// Package window builds windowed jobs on Sluice's keyed state and timers:
// tumbling, sliding and session windows, in event time or processing time,
// and windows of a number of records (TumblingCount, SlidingCount),
// with incremental aggregation (Reduce, Aggregate) or full-window functions
// (Process), Flink's default trigger with early firings by time or count,
// allowed lateness and a side output
// for records too late for any window. It is a library over the public API
// (sluice.Job, kstate, Context.Timers): window state is keyed state of the
// record's key and its timers are the key's timers, so both are exactly
// once, and move with their key in savepoints and rescaling.
//
// Declare a Spec and turn it into a job:
//
//	job, err := window.Job(window.Spec[Reading, Mean]{
//		Name:      "average",
//		Assigner:  window.TumblingEventTime(time.Minute),
//		Function:  window.Aggregate[Reading, Acc, Mean](average{}, kstate.JSON[Acc]()),
//		Decode:    parse,
//		Encode:    func(key []byte, w window.Window, m Mean) ([]byte, error) { return json.Marshal(m) },
//		Timestamp: readingTime,
//		AllowedLateness: 10 * time.Second,
//		LateOutput:      late,
//	})
//
// A window fires when the watermark (event time) or the clock (processing
// time) reaches its end, emitting its results keyed by the record key; it
// is cleared then, or allowed-lateness later, during which a late record
// updates it and fires it again. A count window fires in the processing
// of the record that completes it. docs/windows.md has the semantics and
// what is not built.
package window
