package v1alpha2

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// BaselineCapabilities are the capabilities a container may add under the
// Pod Security Standard baseline; any other is a privilege.
var BaselineCapabilities = []corev1.Capability{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
	"MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// UnsafePods lists what, in the pods a spec asks for, would let whoever
// wrote it act beyond the service: a ServiceAccount other than the
// service's own, privilege, host namespaces, host paths or host ports.
// The spoke refuses to render a hub's copy that has any (the hub's
// credential must not run pods as a spoke's controllers), and the spoke
// access admission policy (deploy/hub/spoke-access, the same rules in CEL)
// refuses the hub's writes of one. schedulerSA is the one ServiceAccount
// the service owns today, its endpoint picker's; workloads run under none.
func (s *LLMInferenceServiceSpec) UnsafePods(schedulerSA string) []string {
	pods := []podAt{{"spec.template", s.Template, nil}, {"spec.worker", s.Worker, nil}}
	if p := s.Prefill; p != nil {
		pods = append(pods, podAt{"spec.prefill.template", p.Template, nil}, podAt{"spec.prefill.worker", p.Worker, nil})
	}
	if s.Router != nil && s.Router.Scheduler != nil {
		pods = append(pods, podAt{"spec.router.scheduler.template", s.Router.Scheduler.Template, []string{schedulerSA}})
	}
	var out []string
	for _, p := range pods {
		if p.spec != nil {
			out = append(out, unsafePod(p.path, p.spec, p.ownSA)...)
		}
	}
	return out
}

// podAt is a pod of a spec, where it is, and the ServiceAccounts it may
// run under.
type podAt struct {
	path  string
	spec  *corev1.PodSpec
	ownSA []string
}

// unsafePod is UnsafePods for one pod, which may run under ownSA.
func unsafePod(path string, p *corev1.PodSpec, ownSA []string) []string {
	var out []string
	for _, sa := range []string{p.ServiceAccountName, p.DeprecatedServiceAccount} {
		if sa != "" && !slices.Contains(ownSA, sa) {
			out = append(out, fmt.Sprintf("%s: ServiceAccount %s is not the service's own", path, sa))
		}
	}
	if p.HostNetwork || p.HostPID || p.HostIPC {
		out = append(out, path+": host namespaces (hostNetwork, hostPID, hostIPC)")
	}
	for _, v := range p.Volumes {
		if v.HostPath != nil {
			out = append(out, fmt.Sprintf("%s: hostPath volume %s", path, v.Name))
		}
	}
	for _, c := range append(slices.Clone(p.InitContainers), p.Containers...) {
		out = append(out, unsafeContainer(fmt.Sprintf("%s container %s", path, c.Name), &c)...)
	}
	return out
}

func unsafeContainer(path string, c *corev1.Container) []string {
	var out []string
	if sc := c.SecurityContext; sc != nil {
		if sc.Privileged != nil && *sc.Privileged {
			out = append(out, path+": privileged")
		}
		if sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation {
			out = append(out, path+": allowPrivilegeEscalation")
		}
		if sc.Capabilities != nil {
			for _, add := range sc.Capabilities.Add {
				if !slices.Contains(BaselineCapabilities, add) {
					out = append(out, fmt.Sprintf("%s: capability %s", path, add))
				}
			}
		}
	}
	for _, p := range c.Ports {
		if p.HostPort != 0 {
			out = append(out, fmt.Sprintf("%s: hostPort %d", path, p.HostPort))
		}
	}
	return out
}
