package kubelet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/localfleet/process"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// container supervises one container of a pod: it prepares and starts the
// process, forwards its ports, probes it, restarts it under the pod's restart
// policy with exponential back-off, and records what a ContainerStatus shows.
type container struct {
	w    *podWorker
	spec *corev1.Container
	init bool // a run-to-completion init container

	mu           sync.Mutex
	proc         *process.Process
	runtimeName  string
	imageID      string // from the image runtime; empty for a mapped binary
	startedAt    time.Time
	ready        bool
	everReady    bool
	started      bool // startup probe passed (or none)
	restartCount int32
	waiting      *corev1.ContainerStateWaiting
	terminated   *corev1.ContainerStateTerminated
	last         *corev1.ContainerStateTerminated
}

func newContainer(w *podWorker, spec *corev1.Container, init bool) *container {
	return &container{w: w, spec: spec, init: init,
		waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
}

// restartable reports whether the container restarts after exiting with
// code: native sidecars always do, others follow the pod's policy.
func (c *container) restartable(code int32) bool {
	if c.spec.RestartPolicy != nil && *c.spec.RestartPolicy == corev1.ContainerRestartPolicyAlways {
		return true
	}
	switch c.w.pod().Spec.RestartPolicy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return !c.init || code != 0
}

// run supervises the container until ctx ends or it exits for good, and
// reports whether it completed successfully.
func (c *container) run(ctx context.Context) bool {
	backoff := c.w.k.opts.RestartBackoff
	for {
		code, started := c.runOnce(ctx)
		if ctx.Err() != nil {
			return false
		}
		// A container that could not be started keeps the waiting reason
		// runOnce gave it and is retried with the same back-off.
		if started {
			if !c.restartable(code) {
				return code == 0
			}
			c.update(func() {
				c.restartCount++
				c.terminated = nil
				c.waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
					Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", backoff, c.spec.Name, c.w.key)}
			})
			c.w.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s", c.spec.Name, c.w.key)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, c.w.k.opts.MaxRestartBackoff)
	}
}

// runOnce starts the container and waits for it to exit, returning the exit
// code and whether it started at all.
func (c *container) runOnce(ctx context.Context) (int32, bool) {
	launch, err := c.prepare(ctx)
	if err != nil {
		reason := "RunContainerError"
		var cfgErr configError
		switch {
		case errors.As(err, &cfgErr):
			reason = "CreateContainerConfigError"
		case errors.Is(err, errNoRuntime), errors.Is(err, ErrImagePull):
			reason = "ErrImagePull"
		}
		c.fail(reason, err)
		return 0, false
	}
	if launch.Completed {
		now := metav1.Now()
		c.update(func() {
			c.waiting = nil
			c.terminated = &corev1.ContainerStateTerminated{Reason: "Completed", StartedAt: now, FinishedAt: now,
				Message: "nothing to do on the local fleet (" + c.runtimeName + ")"}
		})
		return 0, true
	}
	var fwds []*wan.Server
	defer func() {
		for _, f := range fwds {
			_ = f.Close()
		}
	}()
	for podPort, local := range launch.Ports {
		f, err := c.w.k.forward(c.w.ip, podPort, local)
		if err != nil {
			c.fail("RunContainerError", fmt.Errorf("forward %s:%d: %w", c.w.ip, podPort, err))
			return 0, false
		}
		fwds = append(fwds, f)
	}
	logPath := filepath.Join(c.w.dir, c.spec.Name+".log")
	proc, err := process.Start(process.Spec{
		Name:    c.w.key + "/" + c.spec.Name,
		Path:    launch.Path,
		Args:    launch.Args,
		Env:     launch.Env,
		Dir:     cmp.Or(launch.Dir, c.w.dir),
		LogPath: logPath,
	}, c.w.k.opts.Registry)
	if err != nil {
		c.fail("RunContainerError", err)
		return 0, false
	}
	c.update(func() {
		c.proc, c.startedAt, c.imageID = proc, time.Now(), launch.ImageID
		c.waiting, c.terminated, c.ready = nil, nil, false
		c.started = c.spec.StartupProbe == nil
	})
	if launch.ImageID != "" {
		c.w.event(corev1.EventTypeNormal, "Started", "Started container %s (%s, %s as image user %q, pid %d)",
			c.spec.Name, c.runtimeName, launch.ImageID, launch.User, proc.PID())
	} else {
		c.w.event(corev1.EventTypeNormal, "Started", "Started container %s (%s, pid %d)", c.spec.Name, c.runtimeName, proc.PID())
	}

	probeCtx, stopProbes := context.WithCancel(ctx)
	unhealthy := make(chan string, 1)
	go c.probe(probeCtx, unhealthy)
	defer stopProbes()

	select {
	case <-ctx.Done():
		proc.Stop(c.w.gracePeriod())
	case msg := <-unhealthy:
		c.w.event(corev1.EventTypeNormal, "Killing", "Container %s failed liveness probe, will be restarted: %s", c.spec.Name, msg)
		proc.Stop(c.w.gracePeriod())
	case <-proc.Done():
	}
	stopProbes()
	code := exitCode(proc.ExitErr())
	msg := terminationMessage(c.spec, code, logPath)
	c.update(func() {
		t := &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Completed",
			StartedAt: metav1.NewTime(c.startedAt), FinishedAt: metav1.Now(), ContainerID: containerID(proc), Message: msg}
		if code != 0 {
			t.Reason = "Error"
		}
		c.terminated, c.last, c.proc, c.ready = t, t, nil, false
	})
	return code, true
}

func (c *container) fail(reason string, err error) {
	first := false
	c.update(func() {
		first = c.waiting == nil || c.waiting.Reason != reason
		c.waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: err.Error()}
	})
	if first {
		c.w.event(corev1.EventTypeWarning, "Failed", "Error: %s: %v", reason, err)
	}
}

// prepare resolves the runtime, environment, arguments and volume paths.
func (c *container) prepare(ctx context.Context) (*Launch, error) {
	rt, err := c.w.k.opts.Runtimes.For(c.spec.Image)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoRuntime, err)
	}
	c.update(func() { c.runtimeName = rt.Name() })
	pod := c.w.pod()
	env, vals, err := containerEnv(ctx, c.w.k.cs, pod, c.spec, c.w.ip, c.w.hostIP)
	if err != nil {
		return nil, err
	}
	if c.w.kubeconfig != "" {
		env = append(env, "KUBECONFIG="+c.w.kubeconfig)
	}
	mounts := newMountRewriter(c.spec, c.w.dir)
	launch, err := rt.Prepare(ctx, &Container{
		Pod: pod, Spec: c.spec, PodIP: c.w.ip, Env: env,
		Command:  mounts.rewriteAll(expandAll(c.spec.Command, vals)),
		Args:     mounts.rewriteAll(expandAll(c.spec.Args, vals)),
		FreePort: freePort,
	})
	if err != nil {
		return nil, err
	}
	if !launch.Completed {
		if _, err := exec.LookPath(launch.Path); err != nil {
			return nil, fmt.Errorf("runtime %s: %w", rt.Name(), err)
		}
	}
	return launch, nil
}

var errNoRuntime = errors.New("image not runnable here")

// probe runs the startup, readiness and liveness probes. Until the container
// is first ready, readiness is checked every 250 ms rather than every
// periodSeconds, so that a test or demo does not wait out a period for a
// server that is already up; afterwards the probe's own timing applies.
// Without a readiness probe a container is ready once started, as in
// Kubernetes.
func (c *container) probe(ctx context.Context, unhealthy chan<- string) {
	spec := c.spec
	var readyFails, liveFails int32
	if d := initialDelay(spec.ReadinessProbe); d > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
	liveNext := time.Now().Add(initialDelay(spec.LivenessProbe))
	for {
		c.mu.Lock()
		started, everReady := c.started, c.everReady
		c.mu.Unlock()
		if !started {
			if err := runProbe(ctx, spec.StartupProbe, spec, c.w.ip); err == nil {
				c.update(func() { c.started = true })
				continue
			}
		} else {
			ready := true
			if spec.ReadinessProbe != nil {
				err := runProbe(ctx, spec.ReadinessProbe, spec, c.w.ip)
				if err != nil {
					readyFails++
					ready = readyFails < threshold(spec.ReadinessProbe.FailureThreshold, 3) && c.isReady()
					if everReady && ctx.Err() == nil {
						c.w.event(corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: %v", err)
					}
				} else {
					readyFails = 0
				}
			}
			c.update(func() {
				c.ready = ready
				c.everReady = c.everReady || ready
			})
			if spec.LivenessProbe != nil && !time.Now().Before(liveNext) {
				liveNext = time.Now().Add(period(spec.LivenessProbe))
				if err := runProbe(ctx, spec.LivenessProbe, spec, c.w.ip); err != nil {
					liveFails++
					c.w.event(corev1.EventTypeWarning, "Unhealthy", "Liveness probe failed: %v", err)
					if liveFails >= threshold(spec.LivenessProbe.FailureThreshold, 3) {
						unhealthy <- err.Error()
						return
					}
				} else {
					liveFails = 0
				}
			}
		}
		wait := 250 * time.Millisecond
		if c.isEverReady() {
			wait = period(spec.ReadinessProbe)
			if spec.LivenessProbe != nil {
				wait = min(wait, period(spec.LivenessProbe))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (c *container) isReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

func (c *container) isEverReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.everReady
}

func initialDelay(p *corev1.Probe) time.Duration {
	if p == nil {
		return 0
	}
	return time.Duration(p.InitialDelaySeconds) * time.Second
}

func period(p *corev1.Probe) time.Duration {
	if p == nil || p.PeriodSeconds <= 0 {
		return 10 * time.Second
	}
	return time.Duration(p.PeriodSeconds) * time.Second
}

func threshold(v, def int32) int32 {
	if v <= 0 {
		return def
	}
	return v
}

// update changes the container's state and asks the pod worker to publish it.
func (c *container) update(f func()) {
	c.mu.Lock()
	f()
	c.mu.Unlock()
	c.w.changed()
}

// status renders the container's ContainerStatus.
func (c *container) status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := corev1.ContainerStatus{
		Name:         c.spec.Name,
		Image:        c.spec.Image,
		ImageID:      cmp.Or(c.imageID, "localfleet://"+imageRepository(c.spec.Image)),
		RestartCount: c.restartCount,
		Ready:        c.ready,
		Started:      ptr.To(c.proc != nil && c.started),
	}
	switch {
	case c.proc != nil:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(c.startedAt)}
		s.ContainerID = containerID(c.proc)
	case c.terminated != nil:
		s.State.Terminated = c.terminated.DeepCopy()
		s.ContainerID = c.terminated.ContainerID
	default:
		s.State.Waiting = c.waiting.DeepCopy()
	}
	if c.last != nil && c.terminated == nil {
		s.LastTerminationState.Terminated = c.last.DeepCopy()
	}
	return s
}

// containerID names the process: the fleet's tests find a pod's process by it.
func containerID(p *process.Process) string { return "localfleet://" + strconv.Itoa(p.PID()) }

func exitCode(err error) int32 {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if code := ee.ExitCode(); code >= 0 {
			return int32(code)
		}
		return 137 // killed by a signal, reported as the kubelet does for SIGKILL
	}
	return 128
}
