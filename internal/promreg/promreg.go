// Package promreg registers a component's Prometheus collectors all or
// none, and unregisters them, for the engine's metrics and the function
// job's alike.
package promreg

import "github.com/prometheus/client_golang/prometheus"

// All registers every collector of cs in reg, or none: a collector refused
// (its name already registered, as another component's metrics are in a
// registry they share) unregisters those before it, and its error is
// returned for the caller to say what to do.
func All(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			Unregister(reg, cs[:i]...)
			return err
		}
	}
	return nil
}

// Unregister unregisters every collector of cs from reg and returns how
// many of them reg did not let go of.
func Unregister(reg prometheus.Registerer, cs ...prometheus.Collector) (left int) {
	for _, c := range cs {
		if !reg.Unregister(c) {
			left++
		}
	}
	return left
}
