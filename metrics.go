package sluice

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/promreg"
)

// metrics are the instance's Prometheus series (DESIGN §8). They register
// on the registry the caller passes, never the global default.
type metrics struct {
	recordsIn, recordsOut, processingErrors, dlq *prometheus.CounterVec
	checkpointDuration                           prometheus.Histogram
	checkpointFailures                           prometheus.Counter
	changelogRecords, changelogBytes             prometheus.Counter
	changelogPerEpoch                            prometheus.Histogram
	transactions                                 *prometheus.CounterVec
	stateKeys, stateBytes, stateHeapBytes        *prometheus.GaugeVec
	restoreDone, restoreRemaining                *prometheus.GaugeVec
	standbyOffset                                *prometheus.GaugeVec
	standbyRecords                               prometheus.Counter
	standbyLag                                   *prometheus.GaugeVec
	warmupAsks                                   prometheus.Counter
	lag                                          *prometheus.GaugeVec
	epoch                                        *prometheus.GaugeVec
	tasks                                        *prometheus.GaugeVec
	timers, watermarkLag                         *prometheus.GaugeVec
	timersFired                                  *prometheus.CounterVec
	ttlExpired                                   prometheus.Counter
	overlapped                                   prometheus.Counter
	pollPartitions                               prometheus.Histogram
}

// newMetrics makes the instance's metrics and returns them with the
// collectors to register (register, in New).
func newMetrics(in *Instance) (*metrics, []prometheus.Collector) {
	task := []string{"task"}
	m := &metrics{
		recordsIn:          prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_records_in_total", Help: "Input records processed, per task."}, task),
		recordsOut:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_records_out_total", Help: "Records emitted by the job (committed or not), per task."}, task),
		processingErrors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_processing_errors_total", Help: "Records whose processing failed, per task."}, task),
		dlq:                prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_dlq_records_total", Help: "Records sent to the dead-letter topic, per task."}, task),
		checkpointDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_checkpoint_duration_seconds", Help: "Time from the barrier to the applied epoch.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		checkpointFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_checkpoint_failures_total", Help: "Checkpoints that did not commit."}),
		changelogRecords:   prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_changelog_records_total", Help: "Changelog records produced (entries, tombstones and markers)."}),
		changelogBytes:     prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_changelog_bytes_total", Help: "Changelog key and value bytes produced."}),
		changelogPerEpoch:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_changelog_records_per_epoch", Help: "Changelog records produced per committed epoch.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		transactions:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_transactions_total", Help: "Epoch ends by result: commit or abort."}, []string{"result"}),
		stateKeys:          prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_state_keys", Help: "Keys in the task's committed store."}, task),
		stateBytes:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_state_bytes", Help: "Approximate bytes in the task's committed store."}, task),
		stateHeapBytes:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_state_heap_bytes", Help: "Estimated Go heap held by the task's committed store (memory backend; 0 for bbolt, whose state is in its file)."}, task),
		restoreDone:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_restore_records_done", Help: "Changelog records read by the task's current or last restore."}, task),
		restoreRemaining:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_restore_records_remaining", Help: "Changelog offsets left to read by the task's restore."}, task),
		standbyOffset:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_standby_changelog_offset", Help: "Changelog offset up to which the standby replica of the task is complete (just past the last epoch marker it applied); its lag is the changelog partition's end minus this."}, task),
		standbyRecords:     prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_standby_records_total", Help: "Changelog records standby replicas read."}),
		standbyLag:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_standby_lag", Help: "Changelog offsets between the standby replica of the task and its changelog's last stable offset, at the standby's last round: what a failover to it would restore."}, task),
		warmupAsks:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_warmup_rebalances_total", Help: "Rebalances this instance asked the group for because a warm-up replica caught up (within AcceptableRecoveryLag), so that its task moves here."}),
		lag:                prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_consumer_lag", Help: "High-water mark minus the next offset to process."}, []string{"topic", "partition"}),
		tasks:              prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_tasks", Help: "Tasks by lifecycle state."}, []string{"state"}),
		timers:             prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_timers", Help: "Timers registered in the task's committed store, per time domain (event, processing)."}, []string{"task", "domain"}),
		watermarkLag:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_watermark_lag_seconds", Help: "Processing time minus the task's event-time watermark, at its last committed epoch (EventTime jobs only)."}, task),
		timersFired:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_timers_fired_total", Help: "Timers fired (committed or not), per task."}, task),
		ttlExpired:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_state_expired_total", Help: "State entries the background sweep removed because their TTL ran out (committed or not)."}),
		overlapped:         prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_overlapped_records_total", Help: "Input records processed while the epoch before them committed (pipelined epochs)."}),
		pollPartitions:     prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_poll_partitions", Help: "Input partitions of running tasks with records in a poll: tasks in parallel and merged input topics need more than 1.", Buckets: prometheus.ExponentialBuckets(1, 2, 8)}),
		epoch:              prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_epoch", Help: "Last epoch the task committed and applied (the number its changelog marker carries)."}, task),
	}
	// Both results exist from the start, so that increase() in an alert
	// sees the first abort instead of a series that appears with it.
	m.transactions.WithLabelValues("commit")
	m.transactions.WithLabelValues("abort")
	cs := []prometheus.Collector{m.recordsIn, m.recordsOut, m.processingErrors, m.dlq, m.checkpointDuration,
		m.checkpointFailures, m.changelogRecords, m.changelogBytes, m.changelogPerEpoch, m.transactions,
		m.stateKeys, m.stateBytes, m.stateHeapBytes, m.restoreDone, m.restoreRemaining, m.standbyOffset, m.standbyRecords, m.standbyLag, m.warmupAsks, m.lag, m.tasks, m.epoch,
		m.timers, m.watermarkLag, m.timersFired, m.ttlExpired, m.overlapped, m.pollPartitions,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_epochs_committed_total", Help: "Epochs this instance committed since it started."},
			func() float64 { return float64(in.committedEpochs.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_open_transaction_age_seconds", Help: "Age of the open epoch's transaction, 0 when none is open."},
			in.openTxnAge),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_ready", Help: "1 when the instance is in its group, has received its first assignment, and every assigned task is restored and running."},
			func() float64 {
				if in.Ready() {
					return 1
				}
				return 0
			}),
	}
	return m, cs
}

// register registers every collector of cs in reg, or none
// (promreg.All), and says what to do when reg refuses one.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if err := promreg.All(reg, cs...); err != nil {
		return fmt.Errorf("sluice: Options.Registry refused the instance's metrics (if it holds another Instance's: Close that Instance, or its Pipeline, if it is done; give each Instance a registry of its own, or wrap the shared one for every Instance, the first too, with prometheus.WrapRegistererWith, the same label name and a value of its own): %w", err)
	}
	return nil
}

func taskLabel(p int32) string { return strconv.Itoa(int(p)) }

// forgetTask drops the gauges of a task this instance gave up, so no stale
// series (a restore that looks stalled, a frozen lag) outlive it here.
func (m *metrics) forgetTask(p int32, topics []string) {
	label := taskLabel(p)
	for _, g := range []*prometheus.GaugeVec{m.stateKeys, m.stateBytes, m.stateHeapBytes, m.restoreDone, m.restoreRemaining, m.epoch, m.watermarkLag} {
		g.DeleteLabelValues(label)
	}
	m.timers.DeletePartialMatch(prometheus.Labels{"task": label})
	for _, topic := range topics {
		m.lag.DeleteLabelValues(topic, label)
	}
}
