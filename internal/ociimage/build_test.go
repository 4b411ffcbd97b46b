package ociimage

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Building the same sources twice, into different directories, gives the
// same digests; a second build into the same layout is taken from the cache.
func TestBuildIsReproducible(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Root: root, Version: "v0.0.1-test", Created: time.Unix(1700000000, 0),
		Components: []Component{{"hello", "./internal/ociimage/testdata/hello", "test image"}}}
	var digests []map[string]string
	for _, dir := range []string{t.TempDir(), t.TempDir()} {
		opts.Out = filepath.Join(dir, "oci")
		res, err := Build(t.Context(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.Cached {
			t.Errorf("first build into %s taken from a cache", opts.Out)
		}
		digests = append(digests, res.Digests)
		checkLayout(t, opts.Out, opts.Components, platformNames(Platforms))
	}
	if !maps.Equal(digests[0], digests[1]) {
		t.Errorf("digests differ between two builds: %v and %v", digests[0], digests[1])
	}
	res, err := Build(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Cached || !maps.Equal(res.Digests, digests[0]) {
		t.Errorf("rebuild of unchanged binaries: cached %v, digests %v, want cached and %v", res.Cached, res.Digests, digests[0])
	}
}

// The images `make images` built (every platform) or `make images-host`
// (this machine's alone, as make test builds them): each runs its binary as
// the nonroot user and carries an SBOM of that binary.
func TestMakeImagesLayout(t *testing.T) {
	want := platformNames(Platforms)
	if !layoutHasAll(t, "../../bin/oci") {
		want = []string{"linux/" + runtime.GOARCH}
	}
	checkLayout(t, "../../bin/oci", Components, want)
}

func platformNames(ps []v1.Platform) []string {
	var names []string
	for _, p := range ps {
		names = append(names, p.String())
	}
	return names
}

// layoutHasAll tells a layout of every platform from one of this machine's,
// by the first image's platforms; checkLayout then holds every image to it.
func layoutHasAll(t *testing.T, dir string) bool {
	t.Helper()
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := root.IndexManifest()
	if err != nil || len(m.Manifests) == 0 {
		t.Fatalf("layout %s: %v", dir, err)
	}
	idx, err := root.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return len(im.Manifests) == len(Platforms)
}

// checkLayout inspects every component's image in the layout: each holds
// exactly wantPlatforms.
func checkLayout(t *testing.T, dir string, components []Component, wantPlatforms []string) {
	t.Helper()
	images, err := Images(dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != len(components) {
		t.Fatalf("layout %s holds %v, want one image per component of %v", dir, images, components)
	}
	for i, c := range components {
		img := images[i]
		if !strings.HasPrefix(img.Ref, Repository+"/"+c.Name+":") {
			t.Errorf("image %d is %s, want %s/%s:<version>", i, img.Ref, Repository, c.Name)
		}
		h, _ := v1.NewHash(img.Digest)
		idx, err := root.ImageIndex(h)
		if err != nil {
			t.Fatal(err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		var platforms []string
		for _, d := range m.Manifests {
			platforms = append(platforms, d.Platform.String())
			im, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := im.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			want := []string{BinDir + "/" + c.Name}
			if !slices.Equal(cf.Config.Entrypoint, want) || cf.Config.User != NonRoot || cf.OS+"/"+cf.Architecture != d.Platform.String() {
				t.Errorf("%s %s: entrypoint %v user %q platform %s/%s, want %v, %q, %s", img.Ref, d.Platform, cf.Config.Entrypoint, cf.Config.User, cf.OS, cf.Architecture, want, NonRoot, d.Platform)
			}
			if cf.Config.Labels["org.opencontainers.image.version"] == "" || cf.Config.Labels["org.opencontainers.image.source"] == "" {
				t.Errorf("%s %s: labels %v", img.Ref, d.Platform, cf.Config.Labels)
			}
			files := imageFiles(t, im)
			var sbom spdxDocument
			if err := json.Unmarshal(files[SBOMDir[1:]+"/"+c.Name+".spdx.json"], &sbom); err != nil || sbom.SPDXVersion != "SPDX-2.3" || len(sbom.Packages) < 2 {
				t.Errorf("%s %s: no SPDX SBOM with the main module and stdlib (%v): %+v", img.Ref, d.Platform, err, sbom)
			}
			for _, f := range []string{BinDir[1:] + "/" + c.Name, "etc/passwd", "etc/group", CACertificates[1:]} {
				if len(files[f]) == 0 {
					t.Errorf("%s %s: /%s missing or empty", img.Ref, d.Platform, f)
				}
			}
		}
		if !slices.Equal(platforms, wantPlatforms) {
			t.Errorf("%s: platforms %v, want %v", img.Ref, platforms, wantPlatforms)
		}
	}
}

// imageFiles reads the regular files of every layer of im.
func imageFiles(t *testing.T, im v1.Image) map[string][]byte {
	t.Helper()
	layers, err := im.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				if files[h.Name], err = io.ReadAll(tr); err != nil {
					t.Fatal(err)
				}
			}
		}
		_ = rc.Close()
	}
	return files
}
