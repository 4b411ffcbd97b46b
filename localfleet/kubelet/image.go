package kubelet

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fleetinfer/fleetinfer/localfleet/registry"
)

// ImageRuntime pulls a container's image from the fleet's registry, unpacks
// it, and runs its entrypoint (or the container's command, by Kubernetes'
// rules) from the unpacked filesystem with the image's environment and
// working directory. What it cannot do here: the process runs as the
// kubelet's own user in the host's namespaces, not as the image's user in a
// container of its own; the image's user is reported in the Started event.
type ImageRuntime struct {
	Description string
	Repos       []string
	Images      *registry.Store
	Flags       PortFlags
}

// ErrImagePull marks a container whose image could not be pulled.
var ErrImagePull = errors.New("image pull failed")

func (r ImageRuntime) Name() string { return r.Description }

func (r ImageRuntime) Matches(image string) bool {
	return matchesAny(image, r.Repos) && r.Images.Serves(image)
}

func (r ImageRuntime) Prepare(ctx context.Context, c *Container) (*Launch, error) {
	img, err := r.Images.Pull(ctx, c.Spec.Image)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrImagePull, err)
	}
	argv := img.Argv(c.Command, c.Args)
	if len(argv) == 0 {
		return nil, fmt.Errorf("image %s has no entrypoint and the container no command", c.Spec.Image)
	}
	exe, err := img.Executable(argv[0])
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", c.Spec.Image, err)
	}
	args, ports, err := r.Flags.rewrite(c, argv[1:])
	if err != nil {
		return nil, err
	}
	return &Launch{Path: exe, Args: args, Env: slices.Concat(img.Config.Env, c.Env), Dir: img.WorkingDir(),
		Ports: ports, ImageID: img.ID, User: img.Config.User}, nil
}
