package function

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/promreg"
)

// metrics are the function job's series, on Options.Registry.
type metrics struct {
	calls    *prometheus.CounterVec // by result
	duration prometheus.Histogram
	records  prometheus.Histogram
	retries  prometheus.Counter
}

// Results of a call, the calls_total label.
const (
	resultOK          = "ok"          // answered; every key OK
	resultKeyFailed   = "key_failed"  // answered; some key RETRY or DEAD_LETTER, or an invalid result
	resultError       = "error"       // timed out or failed (retried)
	resultUnavailable = "unavailable" // the function could not be reached
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_function_calls_total",
			Help: "Invoke calls to the function, by result: ok, key_failed (a key answered RETRY or DEAD_LETTER, or invalid), error (timed out or failed), unavailable (not reachable).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_function_call_duration_seconds",
			Help:    "Duration of Invoke calls to the function.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		records: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_function_batch_records",
			Help:    "Events (records and timers) per Invoke call.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_function_retries_total",
			Help: "Keys sent again after a failed call or a RETRY answer.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	if err := promreg.All(reg, m.calls, m.duration, m.records, m.retries); err != nil {
		return nil, fmt.Errorf("function: Options.Registry refused the function metrics (if it holds another function job's: give each a registry of its own, or wrap the shared one for every job, the first too, with prometheus.WrapRegistererWith, the same label name and a value of its own): %w", err)
	}
	return m, nil
}
