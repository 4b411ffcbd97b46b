package v1alpha2

// Labels and values KServe puts on an LLMInferenceService's children, which
// fleetinfer keeps so that tools selecting KServe's children select
// fleetinfer's too.
const (
	LabelPartOf    = "app.kubernetes.io/part-of"
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	LabelKServe    = "kserve.io/component"
	LabelRole      = "llm-d.ai/role"

	PartOfValue    = "llminferenceservice"
	KServeWorkload = "workload"

	RoleBoth    = "both"
	RoleDecode  = "decode"
	RolePrefill = "prefill"

	ComponentWorkload        = "llminferenceservice-workload"
	ComponentWorkloadPrefill = "llminferenceservice-workload-prefill"
	ComponentLeader          = "llminferenceservice-workload-leader"
	ComponentLeaderPrefill   = "llminferenceservice-workload-leader-prefill"
	ComponentWorker          = "llminferenceservice-workload-worker"
	ComponentWorkerPrefill   = "llminferenceservice-workload-worker-prefill"
	ComponentScheduler       = "llminferenceservice-router-scheduler"
	ComponentRouter          = "llminferenceservice-router"
)
