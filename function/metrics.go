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

	reg prometheus.Registerer // nil: unregistered
}

// Results of a call, the calls_total label.
const (
	resultOK          = "ok"          // answered; every key OK
	resultKeyFailed   = "key_failed"  // answered; some key RETRY, DEAD_LETTER or PARTIAL, or an invalid result
	resultError       = "error"       // timed out or failed (retried)
	resultUnavailable = "unavailable" // the function could not be reached
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_function_calls_total",
			Help: "Invoke calls to the function, by result: ok, key_failed (a key answered RETRY, DEAD_LETTER or PARTIAL, or invalid), error (timed out or failed), unavailable (not reachable).",
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
	if err := promreg.All(reg, m.collectors()...); err != nil {
		return nil, fmt.Errorf("function: Options.Registry refused the function metrics (if it holds another function job's: close that job if it is done; give each a registry of its own, or wrap the shared one for every job, the first too, with prometheus.WrapRegistererWith, the same label name and a value of its own): %w", err)
	}
	m.reg = reg
	return m, nil
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.calls, m.duration, m.records, m.retries}
}

// unregister takes the metrics off their registry (fn.close calls it
// once); the series keep counting, unseen, if calls are still made.
func (m *metrics) unregister() error {
	if m.reg == nil {
		return nil
	}
	cs := m.collectors()
	if left := promreg.Unregister(m.reg, cs...); left > 0 {
		return fmt.Errorf("function: Options.Registry did not unregister %d of the job's %d metric collectors", left, len(cs))
	}
	return nil
}
