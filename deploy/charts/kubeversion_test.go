package charts

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// The charts render for the Kubernetes fleetinfer is built against unless a
// caller names another; the constant must follow go.mod's k8s.io/api.
func TestBuiltKubeVersionFollowsGoMod(t *testing.T) {
	const path = "../../go.mod"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.ParseLax(path, b, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Require {
		if r.Mod.Path == "k8s.io/api" {
			want := "v1." + strings.TrimPrefix(r.Mod.Version, "v0.")
			if builtKubeVersion != want {
				t.Fatalf("builtKubeVersion = %s; go.mod requires k8s.io/api %s, so set it to %s", builtKubeVersion, r.Mod.Version, want)
			}
			return
		}
	}
	t.Fatalf("%s requires no k8s.io/api", path)
}
