package kubelet

import (
	"fmt"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
)

// BinaryRuntime runs an image as a binary built from this repository (or
// compatible with one), with the container's args. Listening ports are given
// as flags; each is rewritten to a free local port and forwarded from the pod
// address, since these binaries bind every interface.
type BinaryRuntime struct {
	Description string
	Repos       []string
	Binary      string
	// PortFlags maps a port flag to the port it defaults to when absent.
	PortFlags map[string]int32
	// AddressFlags are like PortFlags for flags whose value is an address
	// ([host]:port, controller-runtime's --metrics-bind-address); they are
	// rewritten to 127.0.0.1 and the free port.
	AddressFlags map[string]int32
	// PodIPFlags are set to the pod's IP when the container does not set
	// them: flags that make a process bind its pod's address as the source
	// of its connections, as a real pod's connections leave from its pod IP
	// (the local fleet's network tells clusters apart by source address).
	PodIPFlags []string
	// Args are added to every container's: settings the local fleet itself
	// needs of the binary.
	Args []string
}

// flagDefault returns the default port of a port or address flag.
func (r BinaryRuntime) flagDefault(name string) (port int32, address, ok bool) {
	if p, ok := r.PortFlags[name]; ok {
		return p, false, true
	}
	p, ok := r.AddressFlags[name]
	return p, true, ok
}

// flagValue renders a flag's value for the local port.
func flagValue(local int, address bool) string {
	if address {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(local))
	}
	return strconv.Itoa(local)
}

func (r BinaryRuntime) Name() string { return r.Description }

func (r BinaryRuntime) Matches(image string) bool { return matchesAny(image, r.Repos) }

// Prepare takes the container's args; a command naming the image's own binary
// contributes its arguments, any other command is refused because there is no
// image filesystem to run it from.
func (r BinaryRuntime) Prepare(c *Container) (*Launch, error) {
	args := c.Args
	if len(c.Command) > 0 {
		if path.Base(c.Command[0]) != path.Base(r.Binary) {
			return nil, fmt.Errorf("command %q is not available: the local kubelet runs this image only as %s", c.Command[0], path.Base(r.Binary))
		}
		args = append(append([]string{}, c.Command[1:]...), c.Args...)
	}
	ports := map[int32]int{}
	seen := map[string]bool{}
	var out []string
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		_, address, isPort := r.flagDefault(name)
		if slices.Contains(r.PodIPFlags, name) && strings.HasPrefix(args[i], "-") {
			seen[name] = true
		}
		if !isPort || !strings.HasPrefix(args[i], "-") {
			out = append(out, args[i])
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if _, port, err := net.SplitHostPort(value); address && err == nil {
			value = port
		}
		p, err := strconv.ParseInt(value, 10, 32)
		if err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("invalid port %q for --%s", value, name)
		}
		local, err := c.FreePort()
		if err != nil {
			return nil, err
		}
		ports[int32(p)] = local
		seen[name] = true
		out = append(out, "--"+name+"="+flagValue(local, address))
	}
	for _, flags := range []map[string]int32{r.PortFlags, r.AddressFlags} {
		for name, def := range flags {
			if seen[name] {
				continue
			}
			local, err := c.FreePort()
			if err != nil {
				return nil, err
			}
			ports[def] = local
			_, address, _ := r.flagDefault(name)
			out = append(out, "--"+name+"="+flagValue(local, address))
		}
	}
	for _, name := range r.PodIPFlags {
		if !seen[name] && c.PodIP != "" {
			out = append(out, "--"+name+"="+c.PodIP)
		}
	}
	return &Launch{Path: r.Binary, Args: append(out, r.Args...), Env: c.Env, Ports: ports}, nil
}
