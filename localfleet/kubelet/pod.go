package kubelet

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// podWorker runs one pod: it gives the pod an address, its volumes and a
// service-account identity, runs init containers in order and then the
// containers, publishes the pod's status whenever a container changes, and on
// deletion stops the processes before removing the pod object, as the
// kubelet's pod workers do.
type podWorker struct {
	k      *Kubelet
	uid    types.UID
	key    string // namespace/name
	dir    string
	ip     string
	hostIP string

	kubeconfig string // empty when the pod does not mount a service-account token
	tokenFile  string
	tokenExp   time.Time

	mu         sync.Mutex
	latest     *corev1.Pod
	inits      []*container
	containers []*container
	initDone   bool
	startTime  metav1.Time
	published  *corev1.PodStatus
	conditions map[corev1.PodConditionType]corev1.PodCondition

	dirty  chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func newPodWorker(k *Kubelet, pod *corev1.Pod, ip, hostIP string) *podWorker {
	return &podWorker{
		k: k, uid: pod.UID, key: pod.Namespace + "/" + pod.Name,
		dir:    filepath.Join(k.opts.Dir, "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		ip:     ip,
		hostIP: hostIP,
		latest: pod.DeepCopy(), startTime: metav1.Now(),
		conditions: map[corev1.PodConditionType]corev1.PodCondition{},
		dirty:      make(chan struct{}, 1), done: make(chan struct{}),
	}
}

func (w *podWorker) pod() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest
}

func (w *podWorker) setPod(p *corev1.Pod) {
	w.mu.Lock()
	w.latest = p.DeepCopy()
	w.mu.Unlock()
}

// changed asks the worker to publish status; calls coalesce.
func (w *podWorker) changed() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

func (w *podWorker) event(typ, reason, format string, args ...any) {
	w.k.recorder.Eventf(w.pod(), typ, reason, format, args...)
}

// gracePeriod is how long a stopping container gets after SIGTERM.
func (w *podWorker) gracePeriod() time.Duration {
	p := w.pod()
	secs := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if p.DeletionGracePeriodSeconds != nil {
		secs = *p.DeletionGracePeriodSeconds
	} else if p.Spec.TerminationGracePeriodSeconds != nil {
		secs = *p.Spec.TerminationGracePeriodSeconds
	}
	return min(time.Duration(secs)*time.Second, w.k.opts.MaxGracePeriod)
}

// run drives the pod until ctx is cancelled (the pod is being deleted or the
// kubelet stops).
func (w *podWorker) run(ctx context.Context) {
	defer close(w.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		w.event(corev1.EventTypeWarning, "FailedMount", "create pod directory: %v", err)
		return
	}
	pod := w.pod()
	for i := range pod.Spec.InitContainers {
		w.inits = append(w.inits, newContainer(w, &pod.Spec.InitContainers[i], !isSidecar(&pod.Spec.InitContainers[i])))
	}
	for i := range pod.Spec.Containers {
		w.containers = append(w.containers, newContainer(w, &pod.Spec.Containers[i], false))
	}
	w.publish(ctx)

	if err := w.setupIdentity(ctx); err != nil {
		w.event(corev1.EventTypeWarning, "FailedMount", "service account token: %v", err)
	}
	w.syncVolumes(ctx)

	wg.Add(1)
	go func() {
		defer wg.Done()
		w.startContainers(ctx, &wg)
	}()

	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-w.dirty:
			w.publish(ctx)
		case <-tick.C:
			w.refreshToken(ctx)
			w.syncVolumes(ctx)
			w.publish(ctx)
		}
	}
}

func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// startContainers runs init containers in order (sidecars keep running), then
// starts every container.
func (w *podWorker) startContainers(ctx context.Context, wg *sync.WaitGroup) {
	for _, c := range w.inits {
		if !c.init {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.run(ctx)
			}()
			continue
		}
		if !c.run(ctx) {
			// A failed init container under restartPolicy Never fails the
			// pod; otherwise run only returns once ctx ends.
			w.changed()
			return
		}
	}
	w.mu.Lock()
	w.initDone = true
	w.mu.Unlock()
	w.changed()
	for _, c := range w.containers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(ctx)
			w.changed()
		}()
	}
}

func (w *podWorker) syncVolumes(ctx context.Context) {
	if err := syncVolumes(ctx, w.k.cs, w.pod(), w.dir, w.tokenFile); err != nil && ctx.Err() == nil {
		w.event(corev1.EventTypeWarning, "FailedMount", "%v", err)
	}
}

// setupIdentity requests a token for the pod's service account, bound to the
// pod, and writes a kubeconfig that reads it from a file, so that a process
// talking to the API server does so with the pod's own RBAC, as it would
// through the in-cluster configuration.
func (w *podWorker) setupIdentity(ctx context.Context) error {
	pod := w.pod()
	if pod.Spec.AutomountServiceAccountToken != nil && !*pod.Spec.AutomountServiceAccountToken {
		return nil
	}
	w.tokenFile = filepath.Join(w.dir, "token")
	if err := w.requestToken(ctx); err != nil {
		return err
	}
	w.kubeconfig = filepath.Join(w.dir, "kubeconfig")
	name := w.k.opts.Cluster
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{Server: w.k.opts.Config.Host, CertificateAuthorityData: w.k.opts.Config.CAData}
	// client-go re-reads a token file, so a refreshed token needs no restart.
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{TokenFile: w.tokenFile}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.WriteToFile(*kc, w.kubeconfig)
}

const tokenLifetime = time.Hour

func (w *podWorker) requestToken(ctx context.Context) error {
	pod := w.pod()
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := w.k.cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	w.tokenExp = tr.Status.ExpirationTimestamp.Time
	return writeIfChanged(w.tokenFile, []byte(tr.Status.Token))
}

// refreshToken renews the token once 80% of its lifetime has passed.
func (w *podWorker) refreshToken(ctx context.Context) {
	if w.tokenFile == "" || time.Until(w.tokenExp) > tokenLifetime/5 {
		return
	}
	if err := w.requestToken(ctx); err != nil && ctx.Err() == nil {
		w.event(corev1.EventTypeWarning, "FailedMount", "refresh service account token: %v", err)
	}
}

// publish computes the pod status and patches it when it changed.
func (w *podWorker) publish(ctx context.Context) {
	st := w.status()
	w.mu.Lock()
	same := w.published != nil && equality.Semantic.DeepEqual(w.published, st)
	w.mu.Unlock()
	if same || ctx.Err() != nil {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": w.uid}, "status": st})
	if err != nil {
		return
	}
	pod := w.pod()
	_, err = w.k.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{FieldManager: "local-kubelet"}, "status")
	if err != nil {
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			w.k.log.Error(err, "publish pod status", "pod", w.key)
			w.changed() // retry on the next tick or change
		}
		return
	}
	w.mu.Lock()
	w.published = st
	w.mu.Unlock()
}

// status renders the pod's status from its containers.
func (w *podWorker) status() *corev1.PodStatus {
	w.mu.Lock()
	initDone := w.initDone
	w.mu.Unlock()
	pod := w.pod()
	st := &corev1.PodStatus{
		HostIP: w.hostIP, HostIPs: []corev1.HostIP{{IP: w.hostIP}},
		PodIP: w.ip, PodIPs: []corev1.PodIP{{IP: w.ip}},
		StartTime: &w.startTime,
	}
	allReady, allStarted, running := true, true, false
	terminal, failed := 0, false
	for _, c := range w.inits {
		cs := c.status()
		st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 && pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			failed = true
		}
	}
	for _, c := range w.containers {
		cs := c.status()
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
		allReady = allReady && cs.Ready
		running = running || cs.State.Running != nil
		everRan := cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil
		allStarted = allStarted && everRan
		if t := cs.State.Terminated; t != nil {
			terminal++
			failed = failed || t.ExitCode != 0
		}
	}
	switch {
	case failed && pod.Spec.RestartPolicy == corev1.RestartPolicyNever && !initDone:
		st.Phase = corev1.PodFailed
	case !initDone || !allStarted:
		st.Phase = corev1.PodPending
	case terminal == len(w.containers) && pod.Spec.RestartPolicy != corev1.RestartPolicyAlways:
		st.Phase = corev1.PodSucceeded
		if failed {
			st.Phase = corev1.PodFailed
		}
	default:
		st.Phase = corev1.PodRunning
	}
	ready := initDone && allReady && running && readinessGatesPass(pod)
	w.setCondition(st, corev1.PodReadyToStartContainers, true, "")
	w.setCondition(st, corev1.PodInitialized, initDone, "ContainersNotInitialized")
	w.setCondition(st, corev1.ContainersReady, initDone && allReady && running, "ContainersNotReady")
	w.setCondition(st, corev1.PodReady, ready, "ContainersNotReady")
	return st
}

// setCondition appends a condition, keeping its transition time while its
// status is unchanged.
func (w *podWorker) setCondition(st *corev1.PodStatus, t corev1.PodConditionType, ok bool, reason string) {
	status := corev1.ConditionFalse
	if ok {
		status, reason = corev1.ConditionTrue, ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	c, seen := w.conditions[t]
	if !seen || c.Status != status {
		c = corev1.PodCondition{Type: t, Status: status, Reason: reason, LastTransitionTime: metav1.Now()}
		w.conditions[t] = c
	}
	st.Conditions = append(st.Conditions, c)
}

func readinessGatesPass(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.ReadinessGates {
		ok := false
		for _, c := range pod.Status.Conditions {
			if c.Type == g.ConditionType && c.Status == corev1.ConditionTrue {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}
