package sluice

import "time"

// WithTimestamp returns ctx with its event time set to t: the returned
// Context's Timestamp reports t, and what it emits (Emit, EmitTo,
// EmitToPartition, Output, Forward) carries t as its Kafka timestamp.
// Everything else is ctx's: the key, state, timers and watermark, and its
// outputs join ctx's record. ctx itself is unchanged, and the returned
// Context is valid as long as ctx is.
//
// Outputs carry the event time of what is being handled by default (the
// record's timestamp, or the timer's time in OnTimer), as in Kafka Streams
// and Flink. WithTimestamp is for an output that stands for something
// else: a window's result stamped with the window's last millisecond
// (package window does so), a join's pair with the later of its two times
// (package join). A time before 1970, which Kafka cannot carry, or after
// 2262, which franz-go cannot encode, stamps the output with the processing
// time instead; Forward keeps one before 1970 (docs/time.md).
//
// ctx should be the Context the engine passed to the job, or one
// WithTimestamp returned; any other only has its Timestamp changed.
func WithTimestamp(ctx Context, t time.Time) Context {
	if c, _, ok := engineContext(ctx); ok {
		return &stampedContext{c, t}
	}
	return otherStamped{ctx, t}
}

// stampedContext is a record context whose outputs carry ts.
type stampedContext struct {
	*recordContext
	ts time.Time
}

func (s *stampedContext) Timestamp() time.Time { return s.ts }

func (s *stampedContext) Emit(key, value []byte, headers ...Header) {
	s.emit(s.in.cfg.OutputTopic, false, 0, key, value, headers, s.ts)
}

func (s *stampedContext) EmitTo(topic string, key, value []byte, headers ...Header) {
	s.emit(topic, false, 0, key, value, headers, s.ts)
}

func (s *stampedContext) EmitToPartition(topic string, partition int32, key, value []byte, headers ...Header) {
	s.emit(topic, true, partition, key, value, headers, s.ts)
}

func (s *stampedContext) Output(tag OutputTag, key, value []byte, headers ...Header) {
	s.output(tag, key, value, headers, s.ts)
}

// otherStamped is a Context that is not the engine's with its Timestamp
// changed.
type otherStamped struct {
	jobContext
	ts time.Time
}

// jobContext names Context for embedding: a field named Context would
// hide the method Context.Context.
type jobContext = Context

func (o otherStamped) Timestamp() time.Time { return o.ts }

// engineContext returns the engine's record context behind ctx and the
// event time of what ctx emits; ok is false for a Context that is not the
// engine's.
func engineContext(ctx Context) (c *recordContext, ts time.Time, ok bool) {
	switch c := ctx.(type) {
	case *recordContext:
		return c, c.ts, true
	case *stampedContext:
		return c.recordContext, c.ts, true
	}
	return nil, time.Time{}, false
}
