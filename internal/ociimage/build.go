// Package ociimage builds fleetinfer's container images from Go, without a
// container runtime and without pulling anything: a static, non-root base
// made here, one Go binary per image built for each platform, an SPDX SBOM
// of the binary inside the image, and a multi-platform image index per
// component, written as an OCI image layout. The same sources, version and
// timestamp give the same digests.
package ociimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Component is one image: a main package and what its labels say.
type Component struct {
	Name        string
	Package     string
	Description string
}

// Components are fleetinfer's images; their names are the last element of
// the repositories the chart and the hub manifests name.
var Components = []Component{
	{"hub", "./cmd/hub", "fleetinfer hub: places LLMInferenceServices on member clusters"},
	{"spoke", "./cmd/spoke", "fleetinfer spoke controller: runs placed LLMInferenceServices in a GPU cluster"},
	{"epp", "./cmd/epp", "fleetinfer endpoint picker: GIE's EPP with a federated, fleet-wide view"},
}

// Platforms are the platforms every image is built for.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// Repository is the registry path the images are named under.
const Repository = "ghcr.io/fleetinfer"

// Reference is the image reference of a component at a version.
func Reference(component, version string) string {
	return Repository + "/" + component + ":" + version
}

// Options configure Build.
type Options struct {
	// Root is the module root the packages are built in.
	Root string
	// Out is the OCI image layout to write.
	Out string
	// Version tags the images and fills org.opencontainers.image.version.
	Version string
	// Created is every timestamp in the images (SOURCE_DATE_EPOCH).
	Created time.Time
	// Components default to Components, Platforms to Platforms.
	Components []Component
	Platforms  []v1.Platform
}

// Result says what Build wrote.
type Result struct {
	// Digests maps each image reference to its index digest.
	Digests map[string]string
	// Cached is set when the layout was already up to date.
	Cached bool
}

// builderVersion changes when the way images are assembled changes, so that
// a layout from an older builder is not taken as up to date.
const builderVersion = "1"

// stamp is written next to the layout: the key of its inputs and the
// digests of what it holds.
type stamp struct {
	Key     string            `json:"key"`
	Digests map[string]string `json:"digests"`
}

const stampFile = "fleetinfer-images.json"

// Build compiles the components for every platform and writes their images
// to opts.Out. When the binaries, version and timestamp are those of the
// layout already there, the layout is left as it is.
func Build(ctx context.Context, opts Options) (Result, error) {
	if len(opts.Components) == 0 {
		opts.Components = Components
	}
	if len(opts.Platforms) == 0 {
		opts.Platforms = Platforms
	}
	if opts.Version == "" {
		return Result{}, errors.New("no version")
	}
	binDir := opts.Out + ".build"
	binaries := map[string]map[string][]byte{} // platform → component → binary
	key := sha256.New()
	fmt.Fprintf(key, "%s\n%s\n%d\n", builderVersion, opts.Version, opts.Created.Unix())
	for _, p := range opts.Platforms {
		dir := filepath.Join(binDir, p.OS+"-"+p.Architecture)
		if err := compile(ctx, opts.Root, dir, p, opts.Components); err != nil {
			return Result{}, err
		}
		binaries[p.String()] = map[string][]byte{}
		for _, c := range opts.Components {
			b, err := os.ReadFile(filepath.Join(dir, c.Name))
			if err != nil {
				return Result{}, err
			}
			binaries[p.String()][c.Name] = b
			sum := sha256.Sum256(b)
			fmt.Fprintf(key, "%s %s %x\n", p, c.Name, sum)
		}
	}
	k := hex.EncodeToString(key.Sum(nil))
	if s, err := readStamp(opts.Out); err == nil && s.Key == k {
		return Result{Digests: s.Digests, Cached: true}, nil
	}
	tmp := opts.Out + ".tmp"
	_ = os.RemoveAll(tmp)
	lp, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return Result{}, err
	}
	base, err := layer(baseEntries(), opts.Created)
	if err != nil {
		return Result{}, err
	}
	res := Result{Digests: map[string]string{}}
	for _, c := range opts.Components {
		ref := Reference(c.Name, opts.Version)
		idx, err := componentIndex(c, ref, opts, base, binaries)
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", ref, err)
		}
		if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
			return Result{}, err
		}
		d, err := idx.Digest()
		if err != nil {
			return Result{}, err
		}
		res.Digests[ref] = d.String()
	}
	b, err := json.MarshalIndent(stamp{Key: k, Digests: res.Digests}, "", "  ")
	if err != nil {
		return Result{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, stampFile), b, 0o644); err != nil {
		return Result{}, err
	}
	if err := os.RemoveAll(opts.Out); err != nil {
		return Result{}, err
	}
	return res, os.Rename(tmp, opts.Out)
}

func readStamp(dir string) (stamp, error) {
	var s stamp
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	return s, err
}

// compile builds the components' static binaries for a platform into dir,
// stripped and without paths or build IDs, so that they are reproducible.
func compile(ctx context.Context, root, dir string, p v1.Platform, cs []Component) error {
	args := []string{"build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", dir + string(filepath.Separator)}
	for _, c := range cs {
		args = append(args, c.Package)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s (%s): %w\n%s", strings.Join(args, " "), p, err, out)
	}
	return nil
}

// componentIndex assembles a component's image for every platform into one
// index.
func componentIndex(c Component, ref string, opts Options, base v1.Layer, binaries map[string]map[string][]byte) (v1.ImageIndex, error) {
	labels := map[string]string{
		"org.opencontainers.image.title":       c.Name,
		"org.opencontainers.image.description": c.Description,
		"org.opencontainers.image.version":     opts.Version,
		"org.opencontainers.image.created":     opts.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.source":      "https://github.com/fleetinfer/fleetinfer",
		"org.opencontainers.image.url":         "https://github.com/fleetinfer/fleetinfer",
		"org.opencontainers.image.vendor":      "fleetinfer",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.ref.name":    ref,
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range opts.Platforms {
		bin := binaries[p.String()][c.Name]
		sbom, err := SBOM(ref+" "+p.String(), bin, opts.Created)
		if err != nil {
			return nil, err
		}
		app, err := layer(binaryEntries(c.Name, bin, sbom), opts.Created)
		if err != nil {
			return nil, err
		}
		created := v1.Time{Time: opts.Created.UTC()}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err = mutate.Append(img,
			mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "fleetinfer base: nonroot user, CA certificates, /tmp", Comment: "static base"}},
			mutate.Addendum{Layer: app, History: v1.History{Created: created, CreatedBy: "go build -trimpath -ldflags='-s -w -buildid=' " + c.Package + "; SPDX SBOM in " + SBOMDir}})
		if err != nil {
			return nil, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.Created, cf.OS, cf.Architecture, cf.Variant = created, p.OS, p.Architecture, p.Variant
		cf.Config = v1.Config{
			Entrypoint: []string{BinDir + "/" + c.Name},
			User:       NonRoot,
			WorkingDir: "/",
			Env:        []string{"PATH=" + BinDir + ":/usr/bin:/bin", "SSL_CERT_FILE=" + CACertificates},
			Labels:     labels,
		}
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return nil, err
		}
		img = mutate.Annotations(img, map[string]string{"org.opencontainers.image.ref.name": ref}).(v1.Image)
		plat := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	return mutate.Annotations(idx, map[string]string{
		"org.opencontainers.image.title":   c.Name,
		"org.opencontainers.image.version": opts.Version,
		"org.opencontainers.image.created": opts.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.source":  "https://github.com/fleetinfer/fleetinfer",
	}).(v1.ImageIndex), nil
}
