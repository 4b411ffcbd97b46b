package gierunner

import (
	"context"
	"maps"
	"slices"
	"testing"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
)

// RegisterInTreePlugins copies GIE's unexported in-tree plugin list; this
// keeps the copy honest. GIE's runner registers its list before it parses
// the configuration, so a configuration that does not parse makes it
// register the plugins and stop there.
func TestRegisterInTreePluginsIsGIEsList(t *testing.T) {
	saved := maps.Clone(fwkplugin.Registry)
	t.Cleanup(func() { fwkplugin.Registry = saved })

	fwkplugin.Registry = map[string]fwkplugin.FactoryFunc{}
	opts := runserver.NewOptions()
	opts.ConfigText = "{not yaml"
	if _, _, err := runner.NewTestRunnerSetup(context.Background(), nil, opts, nil, nil); err == nil {
		t.Fatal("GIE's setup accepted an invalid configuration")
	}
	gie := slices.Sorted(maps.Keys(fwkplugin.Registry))

	fwkplugin.Registry = map[string]fwkplugin.FactoryFunc{}
	RegisterInTreePlugins()
	if got := slices.Sorted(maps.Keys(fwkplugin.Registry)); !slices.Equal(got, gie) {
		t.Fatalf("registered %v\nwant GIE's %v", got, gie)
	}
}
