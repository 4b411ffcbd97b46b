package fleet

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
	"github.com/fleetinfer/fleetinfer/localfleet/registry"
)

// startRegistry serves the fleet's OCI registry on loopback with its blobs
// under the fleet's directory, pushes fleetinfer's images from the layout
// `make images` wrote, and sets up the store the kubelets and the fleet's
// controllers pull from. ghcr.io/fleetinfer/* is mirrored to the registry, as
// a containerd registry mirror would be: the chart and the manifests keep
// their image names.
func (f *Fleet) startRegistry(ctx context.Context) error {
	images, err := ociimage.Images(f.opts.Binaries.Images)
	if err != nil {
		return err
	}
	if f.registry, err = registry.Serve(filepath.Join(f.dir, "registry")); err != nil {
		return err
	}
	mirror := ociimage.Mirror{From: ociimage.Repository, To: f.registry.Addr() + "/fleetinfer"}
	if _, err := ociimage.Push(ctx, f.opts.Binaries.Images, mirror, true); err != nil {
		return err
	}
	f.mirror = mirror
	f.Images = registry.NewStore(filepath.Join(f.dir, "images"), mirror)
	f.ImageDigests = map[string]string{}
	for _, img := range images {
		f.ImageDigests[img.Ref] = img.Digest
	}
	return nil
}

// PushImages pushes the images of another layout to the fleet's registry,
// mirrored as the fleet's own are: a second version, as an upgrade needs.
func (f *Fleet) PushImages(ctx context.Context, layout string) error {
	_, err := ociimage.Push(ctx, layout, f.mirror, true)
	return err
}

// Image is the reference of a fleetinfer component's image in the fleet
// (ghcr.io/fleetinfer/<component>:<version of the layout>).
func (f *Fleet) Image(component string) string {
	for ref := range f.ImageDigests {
		if strings.HasPrefix(ref, ociimage.Repository+"/"+component+":") {
			return ref
		}
	}
	return ociimage.Repository + "/" + component
}

// StartImage runs image's entrypoint from its unpacked filesystem with spec's
// args appended (a container with args and no command), the image's
// environment before spec's and its working directory, for processes that
// run as a pod would but on the hub, which has no kubelet.
func (f *Fleet) StartImage(ctx context.Context, image string, spec process.Spec) (*process.Process, *registry.Image, error) {
	img, err := f.Images.Pull(ctx, image)
	if err != nil {
		return nil, nil, err
	}
	argv := img.Argv(nil, spec.Args)
	if len(argv) == 0 {
		return nil, nil, fmt.Errorf("image %s has no entrypoint", image)
	}
	if spec.Path, err = img.Executable(argv[0]); err != nil {
		return nil, nil, err
	}
	spec.Args = argv[1:]
	spec.Env = slices.Concat(img.Config.Env, spec.Env)
	spec.Dir = img.WorkingDir()
	p, err := process.Start(spec, f.Registry)
	return p, img, err
}

// NotFromImages lists the processes the fleet started for fleetinfer's
// components (an executable named like one of its images) that did not run
// from an image the fleet pulled: a component run from a mapped or built
// binary.
func (f *Fleet) NotFromImages() []string {
	var out []string
	for _, p := range f.Registry.Started() {
		component := slices.ContainsFunc(ociimage.Components, func(c ociimage.Component) bool { return filepath.Base(p.Path) == c.Name })
		if rel, err := filepath.Rel(f.Images.Dir(), p.Path); component && (err != nil || !filepath.IsLocal(rel)) {
			out = append(out, p.Name+" ("+p.Path+")")
		}
	}
	return out
}
