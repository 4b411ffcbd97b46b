package kubelet

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The worker of KServe's data-parallel preset is a headless vLLM: it gets a
// process that stays up and no port, so no request can reach it.
func TestHeadlessVLLMWorkerOnlyStaysUp(t *testing.T) {
	script := "exec vllm serve /mnt/models --headless --data-parallel-size 16 --data-parallel-address ${LWS_LEADER_ADDRESS} ${VLLM_ADDITIONAL_ARGS} \"$@\""
	c := &Container{
		Pod:     &corev1.Pod{},
		Command: []string{"/bin/bash", "-c", script, "--"},
		Env:     []string{"LWS_LEADER_ADDRESS=dp-0.dp.ns"},
		FreePort: func() (int, error) {
			t.Fatal("a headless worker reserved a port")
			return 0, nil
		},
	}
	l, err := SimulatorRuntime{Binary: "llm-d-inference-sim"}.Prepare(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if l.Path != "sleep" || len(l.Ports) != 0 {
		t.Errorf("headless worker runs %s %q with ports %v", l.Path, l.Args, l.Ports)
	}
}
