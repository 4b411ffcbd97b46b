package ociimage

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Mirror rewrites image references under From to the same path under To, as
// a containerd registry mirror (hosts.toml) serves ghcr.io/fleetinfer/* from
// another registry.
type Mirror struct {
	From, To string
}

// Rewrite returns image with From replaced by To, or image unchanged when it
// is not under From.
func (m Mirror) Rewrite(image string) string {
	if rest, ok := strings.CutPrefix(image, m.From+"/"); ok && m.From != "" {
		return m.To + "/" + rest
	}
	return image
}

// Image is one image of a layout: its reference and index digest.
type Image struct {
	Ref, Digest string
}

// Images lists the images of the layout at dir.
func Images(dir string) ([]Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read the image layout %s (run `make images`): %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, d := range m.Manifests {
		if ref := d.Annotations["org.opencontainers.image.ref.name"]; ref != "" {
			out = append(out, Image{Ref: ref, Digest: d.Digest.String()})
		}
	}
	return out, nil
}

// Push writes every image of the layout at dir to the registry the mirror
// names, under its reference rewritten by the mirror, and returns the
// references pushed with their digests. insecure pushes over plain HTTP (a
// loopback registry). Credentials, when the registry needs them, come from
// REGISTRY_USERNAME and REGISTRY_PASSWORD.
func Push(ctx context.Context, dir string, m Mirror, insecure bool) ([]string, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read the image layout %s (run `make images`): %w", dir, err)
	}
	images, err := Images(dir)
	if err != nil {
		return nil, err
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	auth := authn.Anonymous
	if u := os.Getenv("REGISTRY_USERNAME"); u != "" {
		auth = &authn.Basic{Username: u, Password: os.Getenv("REGISTRY_PASSWORD")}
	}
	var pushed []string
	for _, img := range images {
		h, err := v1.NewHash(img.Digest)
		if err != nil {
			return pushed, err
		}
		idx, err := root.ImageIndex(h)
		if err != nil {
			return pushed, err
		}
		ref, err := name.ParseReference(m.Rewrite(img.Ref), opts...)
		if err != nil {
			return pushed, err
		}
		if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuth(auth)); err != nil {
			return pushed, fmt.Errorf("push %s: %w", ref, err)
		}
		pushed = append(pushed, ref.String()+"@"+img.Digest)
	}
	return pushed, nil
}
