package gierunner

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/mod/modfile"
)

const gieModule = "sigs.k8s.io/gateway-api-inference-extension"

// This package copies GIE's runner at UpstreamVersion. When go.mod pins
// another GIE, the copy may no longer match what GIE does.
func TestGIEIsPinnedAtTheCopiedVersion(t *testing.T) {
	path := goMod(t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Replace {
		if r.Old.Path == gieModule {
			t.Fatalf("%s replaces %s with %s %s: this package copies GIE's %s; re-diff it against what the replacement builds", path, gieModule, r.New.Path, r.New.Version, UpstreamVersion)
		}
	}
	for _, r := range f.Require {
		if r.Mod.Path != gieModule {
			continue
		}
		if r.Mod.Version != UpstreamVersion {
			t.Fatalf("%s pins %s %s, but this package copies its runner at %s.\n"+
				"Re-diff the upstream files named in the package doc (cmd/epp/runner/runner.go and health.go, "+
				"internal/runnable/grpc.go and leader_election.go, internal/tls/tls.go, pkg/epp/server/runserver.go) "+
				"between %s and %s, carry the changes over (keeping the \"fleetinfer:\" ones), then set UpstreamVersion.",
				path, gieModule, r.Mod.Version, UpstreamVersion, UpstreamVersion, r.Mod.Version)
		}
		return
	}
	t.Fatalf("%s does not require %s", path, gieModule)
}

// goMod is the module's go.mod, found upwards from the package directory.
func goMod(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		path := filepath.Join(dir, "go.mod")
		if _, err := os.Stat(path); err == nil {
			return path
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the package directory")
		}
		dir = parent
	}
}
