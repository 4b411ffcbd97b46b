// Package registrations records the collectors registered with
// controller-runtime's metrics registry from the moment it is initialised,
// so that refdocs can describe the hub's metrics, which its packages
// register in their init functions and export no other way.
//
// It must be initialised after controller-runtime's metrics package and
// before any fleetinfer package that registers there. The Go spec (since
// Go 1.21) initialises packages in import-path order once their imports
// are: this package only imports those two, and its path
// (github.com/fleetinfer/fleetinfer/hack/...) sorts before every package of
// hub/, spoke/ and internal/, so it is initialised as soon as the
// registry is, before them. epp/ sorts earlier, but the picker registers
// its metrics when it runs, not at init.
package registrations

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	mu         sync.Mutex
	collectors []prometheus.Collector
)

// recorder passes registrations on to the registry and records them.
type recorder struct{ ctrlmetrics.RegistererGatherer }

func (r recorder) Register(c prometheus.Collector) error {
	mu.Lock()
	collectors = append(collectors, c)
	mu.Unlock()
	return r.RegistererGatherer.Register(c)
}

func (r recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func init() { ctrlmetrics.Registry = recorder{ctrlmetrics.Registry} }

// Collectors returns the collectors registered since the registry was
// initialised, in registration order.
func Collectors() []prometheus.Collector {
	mu.Lock()
	defer mu.Unlock()
	return append([]prometheus.Collector(nil), collectors...)
}
