// Package promreg registers a component's Prometheus collectors all or
// none, for the engine's metrics and the function job's alike.
package promreg

import "github.com/prometheus/client_golang/prometheus"

// All registers every collector of cs in reg, or none: a collector refused
// (its name already registered, as another component's metrics are in a
// registry they share) unregisters those before it, and its error is
// returned for the caller to say what to do.
func All(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}
