// Package sluice is exactly-once, stateful stream processing for Go services
// on Kafka.
//
// Declare a Job with a ProcessFunc, keep keyed state with the descriptors of
// package kstate, and run it with New and Instance.Run:
//
//	var count = kstate.Value[int64]("count", kstate.Int64())
//
//	job := sluice.Job{Name: "count", Emits: true, Process: func(ctx sluice.Context, rec *sluice.Record) error {
//		n, _, err := count.Get(ctx)
//		if err != nil {
//			return err
//		}
//		if err := count.Set(ctx, n+1); err != nil {
//			return err
//		}
//		ctx.Emit(rec.Key, []byte(strconv.FormatInt(n+1, 10)))
//		return nil
//	}}
//	inst, err := sluice.New(sluice.Options{Job: job, Brokers: ..., AppID: "counter", ...})
//	err = inst.Run(ctx)
//
// Each epoch's state changes, outputs and input offsets commit in one Kafka
// transaction; a read_committed consumer of the output sees every input
// reflected exactly once.
package sluice

import (
	"time"

	"github.com/sluicehq/sluice/internal/api"
	"github.com/sluicehq/sluice/internal/engine"
)

type (
	// Record is an input record.
	Record = api.Record
	// Header is a record header.
	Header = api.Header
	// Context is what a ProcessFunc gets per record; it scopes keyed state.
	Context = api.Context
	// ProcessFunc handles one record.
	ProcessFunc = api.ProcessFunc
	// Job declares a job.
	Job = api.Job
	// DecodeError marks a record whose bytes do not decode.
	DecodeError = api.DecodeError
	// OutputTag names a side output: sluice.OutputTag("late").
	OutputTag = api.OutputTag
	// Timers registers and deletes the current key's timers.
	Timers = api.Timers
	// Timer is a timer that fired.
	Timer = api.Timer
	// TimeDomain is the clock a timer runs on: EventTime or ProcessingTime.
	TimeDomain = api.TimeDomain
	// TimerFunc handles a timer that fired (Job.OnTimer).
	TimerFunc = api.TimerFunc
	// TimestampFunc extracts a record's event time (Job.Timestamp).
	TimestampFunc = api.TimestampFunc
	// Clock is the processing-time clock (Options.Clock).
	Clock = engine.Clock

	// Options configures an instance; see the field docs.
	Options = engine.Config
	// Instance is one running processor instance.
	Instance = engine.Instance
	// Guarantee is exactly_once or at_least_once.
	Guarantee = engine.Guarantee

	// ACL is one permission an instance needs; Options.ACLs lists them.
	ACL = engine.ACL
	// PermissionError is what Run returns when the brokers refuse an
	// operation for want of an ACL; it names the ACL.
	PermissionError = engine.PermissionError
	// AuthError is what Run returns when the brokers refuse the
	// instance's credentials or a TLS handshake fails on a certificate.
	AuthError = engine.AuthError
)

const (
	ExactlyOnce = engine.ExactlyOnce
	AtLeastOnce = engine.AtLeastOnce

	// EventTime timers fire when the task's watermark passes them.
	EventTime = api.EventTime
	// ProcessingTime timers fire when the processing-time clock passes
	// them.
	ProcessingTime = api.ProcessingTime
)

// KafkaTime is the TimestampFunc that takes a record's Kafka timestamp.
func KafkaTime(rec *Record) (time.Time, error) { return api.KafkaTime(rec) }

// Fatal wraps an error so that returning it stops the instance rather than
// dead-lettering the record.
func Fatal(err error) error { return api.Fatal(err) }

// New validates opts and builds an instance; Run starts it.
func New(opts Options) (*Instance, error) { return engine.New(opts) }
