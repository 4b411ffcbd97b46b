package registry

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
)

// Kubernetes' rules for a container's command and args over an image's
// Entrypoint and Cmd.
func TestArgvFollowsKubernetesCommandAndArgsRules(t *testing.T) {
	img := &Image{Config: v1.Config{Entrypoint: []string{"/bin/app"}, Cmd: []string{"--default"}}}
	for _, tc := range []struct {
		name          string
		command, args []string
		want          []string
	}{
		{"neither: entrypoint and cmd", nil, nil, []string{"/bin/app", "--default"}},
		{"args replace cmd", nil, []string{"--x"}, []string{"/bin/app", "--x"}},
		{"command replaces entrypoint and drops cmd", []string{"/bin/other"}, nil, []string{"/bin/other"}},
		{"command and args", []string{"/bin/other"}, []string{"--y"}, []string{"/bin/other", "--y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := img.Argv(tc.command, tc.args); !slices.Equal(got, tc.want) {
				t.Errorf("argv %v, want %v", got, tc.want)
			}
		})
	}
}

// An image pushed to the registry under a mirrored name is pulled by tag
// and by digest, unpacked once, and reported by its index digest.
func TestStorePullsThroughTheMirrorAndUnpacksOnce(t *testing.T) {
	srv, err := Serve(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	img, err := random.Image(512, 2)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Entrypoint: []string{"/bin/app"}, WorkingDir: "/work", Env: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
	ref, err := name.ParseReference(srv.Addr()+"/fleetinfer/app:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	digest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	store := NewStore(t.TempDir(), ociimage.Mirror{From: ociimage.Repository, To: srv.Addr() + "/fleetinfer"})
	if !store.Serves(ociimage.Repository+"/app:v1") || store.Serves("docker.io/library/app:v1") {
		t.Error("the store serves what its mirror does not cover, or not what it covers")
	}
	for _, image := range []string{ociimage.Repository + "/app:v1", ociimage.Repository + "/app@" + digest.String()} {
		got, err := store.Pull(t.Context(), image)
		if err != nil {
			t.Fatal(err)
		}
		if want := ociimage.Repository + "/app@" + digest.String(); got.ID != want {
			t.Errorf("pull %s: ID %s, want %s", image, got.ID, want)
		}
		if got.WorkingDir() != filepath.Join(got.RootFS, "work") || !slices.Equal(got.Config.Entrypoint, []string{"/bin/app"}) {
			t.Errorf("pull %s: working dir %s, config %+v", image, got.WorkingDir(), got.Config)
		}
		entries, err := os.ReadDir(filepath.Dir(got.RootFS))
		if err != nil || len(entries) != 2 { // rootfs and config.json
			t.Errorf("unpacked image directory holds %v (%v)", entries, err)
		}
	}
}
