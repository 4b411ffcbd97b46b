package epp

import (
	"maps"
	"slices"
	"testing"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"github.com/fleetinfer/fleetinfer/epp/internal/gierunner"
	"github.com/fleetinfer/fleetinfer/epp/plugins/crosscluster"
	"github.com/fleetinfer/fleetinfer/epp/plugins/inflight"
)

// fleetinfer's plugin types come next to GIE's (whose list gierunner's test
// checks against GIE's own registration), and take none of their names.
func TestRegisterPluginsAddsFleetinfersNextToGIEs(t *testing.T) {
	saved := maps.Clone(fwkplugin.Registry)
	t.Cleanup(func() { fwkplugin.Registry = saved })

	fwkplugin.Registry = map[string]fwkplugin.FactoryFunc{}
	gierunner.RegisterInTreePlugins()
	gie := slices.Sorted(maps.Keys(fwkplugin.Registry))
	registerPlugins(&spillPolicy{})
	want := slices.Sorted(slices.Values(append(gie, crosscluster.FilterType, crosscluster.ScorerType, inflight.ScorerType)))
	if got := slices.Sorted(maps.Keys(fwkplugin.Registry)); !slices.Equal(got, want) {
		t.Fatalf("registered %v\nwant GIE's %v plus fleetinfer's", got, gie)
	}
}
