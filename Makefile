# fleetinfer — see README.md. `make demo` and `make test` do all set-up.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
# -trimpath everywhere, as the images and the pinned tools are built: build,
# vet, tests and images then share one compile of every package (a cold
# make test compiled the project twice without it).
export GOFLAGS := -buildvcs=false -trimpath
export CGO_ENABLED := 0

ROOT := $(abspath .)
BIN := $(ROOT)/bin
DURATION ?= 40s
SPOKES ?= 3
TEST_TIMEOUT ?= 40m
# make chaos takes about 30 minutes when every case passes; a failing case waits out its bounds.
CHAOS_TIMEOUT ?= 75m
FLEET_DIR ?= .fleet
# make images and make release build every platform; make test, demo, chaos,
# fleet-up and the benchmarks run images on this machine only, so they build
# its platform alone (the other one doubled a cold make test's image build).
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
HOST_PLATFORM := linux/$(shell go env GOARCH)
STEP := hack/step.sh

# Tool versions come from the pinning modules under hack/tools; each tool is
# built once per version into bin/<tool>-<version>/ and reused afterwards.
modversion = $(shell awk '$$1=="require" {$$1=""; $$0=$$0} $$1=="$(2)" {print $$2}' hack/tools/$(1)/go.mod)
KUBE_VERSION := $(call modversion,kube,k8s.io/kubernetes)
ETCD_VERSION := $(call modversion,etcd,go.etcd.io/etcd/server/v3)
SIM_VERSION := $(call modversion,sim,github.com/llm-d/llm-d-inference-sim)
CONTROLLER_GEN_VERSION := $(call modversion,controller-gen,sigs.k8s.io/controller-tools)
PROTOBUF_VERSION := $(call modversion,protogen,google.golang.org/protobuf)
GRPC_GEN_VERSION := $(strip $(call modversion,protogen,google.golang.org/grpc/cmd/protoc-gen-go-grpc))
PROTOCOMPILE_VERSION := $(call modversion,protogen,github.com/bufbuild/protocompile)
LWS_VERSION := $(call modversion,lws,sigs.k8s.io/lws)

KUBE_DIR := $(BIN)/kube-$(KUBE_VERSION)
KUBE_BINS := $(addprefix $(KUBE_DIR)/,kube-apiserver kube-controller-manager kube-scheduler kubectl)
ETCD := $(BIN)/etcd-$(ETCD_VERSION)/etcd
SIM := $(BIN)/sim-$(SIM_VERSION)/llm-d-inference-sim
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
PROTOGEN_DIR := $(BIN)/protogen-$(PROTOCOMPILE_VERSION)-$(PROTOBUF_VERSION)-$(GRPC_GEN_VERSION)
PROTOGEN := $(PROTOGEN_DIR)/protogen
LWS_DIR := $(BIN)/lws-$(LWS_VERSION)
LWS_FILES := $(addprefix $(LWS_DIR)/,lws webhook.yaml role.yaml)
# A count, not a duration: go1.26's fuzz coordinator can fail a target with
# "context deadline exceeded" when a -fuzztime duration ends mid-exec
# (golang/go#75804, fixed in go1.27); a count sets no deadline.
FUZZTIME ?= 2000x
FUZZLONG ?= 10m
# Images are tagged with the chart's appVersion (what the chart and the hub
# manifests name) and stamped with SOURCE_DATE_EPOCH (1970 when unset).
VERSION ?= $(shell awk '$$1=="appVersion:" {print $$2}' deploy/charts/fleetinfer-spoke/Chart.yaml)
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(KUBE_VERSION:v%=%))) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION:v%=%)))

.PHONY: all tools build images images-host release test chaos unit e2e demo fleet-up fleet-down vet fmt manifests generate verify-generated verify-layering fuzz fuzz-long bench bench-epp bench-hub bench-routing clean help

all: build

help: ## List targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

tools: $(KUBE_BINS) $(ETCD) $(SIM) $(CONTROLLER_GEN) $(PROTOGEN) $(LWS_FILES) ## Build the pinned control plane, simulator, LeaderWorkerSet controller and generators (once per version).

$(KUBE_BINS) &:
	@echo "==> building Kubernetes $(KUBE_VERSION) control plane (first time only, several minutes)"
	cd hack/tools/kube && go build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $(KUBE_DIR)/ \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl

$(ETCD):
	@echo "==> building etcd $(ETCD_VERSION)"
	cd hack/tools/etcd && go build -trimpath -o $@ .

$(SIM):
	@echo "==> building llm-d-inference-sim $(SIM_VERSION)"
	cd hack/tools/sim && go build -trimpath -o $@ github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim

# The LeaderWorkerSet controller with its webhook configurations and ClusterRole
# from the same module: kustomize renders config/webhook as LWS's own install
# does (the pod webhooks only see pods of a LeaderWorkerSet). The controller
# compiles beside Kubernetes; only the rendering waits for kubectl.
$(LWS_DIR)/lws:
	@echo "==> building LeaderWorkerSet controller $(LWS_VERSION)"
	cd hack/tools/lws && go build -trimpath -ldflags "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$(LWS_VERSION)" \
		-o $@ sigs.k8s.io/lws/cmd

$(LWS_DIR)/webhook.yaml $(LWS_DIR)/role.yaml &: | $(KUBE_BINS)
	mkdir -p $(LWS_DIR) && src=$$(cd hack/tools/lws && go list -m -f '{{.Dir}}' sigs.k8s.io/lws) && \
	$(KUBE_DIR)/kubectl kustomize "$$src/config/webhook" > $(LWS_DIR)/webhook.yaml.tmp && \
	mv $(LWS_DIR)/webhook.yaml.tmp $(LWS_DIR)/webhook.yaml && \
	install -m 0644 "$$src/config/rbac/role.yaml" $(LWS_DIR)/role.yaml

$(CONTROLLER_GEN):
	@echo "==> building controller-gen $(CONTROLLER_GEN_VERSION)"
	cd hack/tools/controller-gen && go build -trimpath -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

$(PROTOGEN):
	@echo "==> building protogen (protocompile $(PROTOCOMPILE_VERSION), protoc-gen-go $(PROTOBUF_VERSION), protoc-gen-go-grpc $(GRPC_GEN_VERSION))"
	cd hack/tools/protogen && go build -trimpath -o $(PROTOGEN_DIR)/ . \
		google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc

build: ## Build fleetinfer's binaries into bin/.
	go build -o $(BIN)/ ./cmd/...

images: ## Build the hub, spoke and picker images (IMAGE_PLATFORMS: linux/amd64 and linux/arm64, SBOM inside) into the OCI layout bin/oci; PUSH=host/prefix also pushes them.
	go run ./hack/images -out $(BIN)/oci -version $(VERSION) -platforms $(IMAGE_PLATFORMS) $(if $(PUSH),-push $(PUSH))

images-host: ## The same images for this machine's platform only (what the local fleet runs).
	@$(MAKE) --no-print-directory images IMAGE_PLATFORMS=$(HOST_PLATFORM) PUSH=

release: ## A release in dist/$(VERSION): images (OCI layout, IMAGE_PLATFORMS), the spoke chart and hub manifests pinned to their digests, register-spoke.sh, SHA256SUMS; PUSH=host/prefix also pushes the images.
	go run ./hack/images -out dist/$(VERSION)/oci -version $(VERSION) -platforms $(IMAGE_PLATFORMS) -release dist/$(VERSION) $(if $(PUSH),-push $(PUSH))

# Each step says when it starts and how long it took, and the summary at the
# end (also on failure) lists them: where a cold run's time goes.
test: ## Build what the tests need (tools in parallel, images for this platform) and run every test, timing each step.
	@$(STEP) --reset
	@trap '$(STEP) --summary' EXIT; \
	$(STEP) tools $(MAKE) --no-print-directory -j4 tools; \
	$(STEP) build $(MAKE) --no-print-directory build; \
	$(STEP) images $(MAKE) --no-print-directory images-host; \
	$(STEP) vet $(MAKE) --no-print-directory vet; \
	$(STEP) verify-generated $(MAKE) --no-print-directory verify-generated; \
	$(STEP) verify-layering $(MAKE) --no-print-directory verify-layering; \
	$(STEP) fuzz $(MAKE) --no-print-directory fuzz; \
	$(STEP) go-test go test -timeout $(TEST_TIMEOUT) -count=1 ./...

chaos: tools build images-host ## The hub's fault suite at full length (2-min cordon and black hole, 20 leader kills, ...), then the steady-state test; FAULT lines give the figures.
	FLEETINFER_CHAOS=1 go test -timeout $(CHAOS_TIMEOUT) -count=1 -v ./e2e -run '^(TestFault.*|TestASecondHubOnTheSameSpokesLeavesTheFirstHubsCopiesAlone|TestHubMovesTheReplicasOfACopyStuckPendingForGPUs|TestHubSteadyStateMakesNoWrites)$$' \
		| tee chaos.log | grep -E '^(FAULT|--- |ok|FAIL|PASS)'

bench: bench-epp bench-hub bench-routing ## Run the benchmarks; results in bench/results/.

bench-epp: tools build images-host ## EPP: fleetinfer (1,000 federated pods) vs GIE v1.5.0's stock EPP (40 local pods); bench/results/epp.{json,md,svg}.
	go build -o $(BIN)/gie-epp sigs.k8s.io/gateway-api-inference-extension/cmd/epp
	go run ./bench/epp -out bench/results -stock-epp $(patsubst $(ROOT)/%,%,$(BIN)/gie-epp)

bench-hub: tools build images-host ## Hub: apply → copy in every spoke for 100 services (vs direct creates) and failover time; bench/results/hub.{json,md,svg}.
	go run ./bench/hub -out bench/results

bench-routing: tools build images-host ## Routing: GIE local, SkyServe round-robin and least-load, fleetinfer, oracle over 8 scenarios on three clusters apart; bench/results/routing.{json,md} and routing-*.svg.
	go build -o $(BIN)/gie-epp sigs.k8s.io/gateway-api-inference-extension/cmd/epp
	go run ./bench/routing -out bench/results -stock-epp $(patsubst $(ROOT)/%,%,$(BIN)/gie-epp)

demo: tools build images-host ## The local fleet demo: a KServe sample placed by the hub, skewed load without and with federation (DURATION=40s per phase, SPOKES=3); report in demo-report/.
	$(BIN)/localfleet --load-duration $(DURATION) --spokes $(SPOKES) --report-dir demo-report

fleet-up: tools build images-host ## Start a local fleet (SPOKES=3) and keep it running until Ctrl-C or `make fleet-down`; kubeconfig in $(FLEET_DIR)/kubeconfig.
	$(BIN)/localfleet up --spokes $(SPOKES) --dir $(FLEET_DIR)

fleet-down: ## Stop the fleet `make fleet-up` runs.
	$(BIN)/localfleet down --dir $(FLEET_DIR)

vet: ## go vet and gofmt.
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC; copy CRDs and presets into deploy/ (chart, hub).
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(CONTROLLER_GEN) crd paths=./apis/... output:crd:dir=$$tmp && \
	rm -f apis/crds/*.yaml && go run ./hack/crdgen $$tmp apis/crds
	hack/sync-crds.sh
	$(CONTROLLER_GEN) rbac:roleName=fleetinfer-spoke paths=./spoke/... output:rbac:dir=deploy/charts/fleetinfer-spoke/generated/rbac
	$(CONTROLLER_GEN) rbac:roleName=fleetinfer-hub paths=./hub/... output:rbac:dir=deploy/hub/rbac
	hack/sync-deploy.sh

generate: $(CONTROLLER_GEN) $(PROTOGEN) ## Generate deepcopy code, the EPP federation protobuf code and the reference pages in docs/reference.
	$(CONTROLLER_GEN) object paths=./apis/...
	$(PROTOGEN) -plugins $(PROTOGEN_DIR) epp/federation/v1/federation.proto
	go run ./hack/refdocs -out docs/reference

fuzz: ## Run each fuzz test for FUZZTIME (default 2000 inputs) on top of its committed corpus.
	go test ./epp/federation -run '^$$' -fuzz '^FuzzDecodeAndApply$$' -fuzztime $(FUZZTIME)
	go test ./epp/federation -run '^$$' -fuzz '^FuzzMessageSequence$$' -fuzztime $(FUZZTIME)
	go test ./epp -run '^$$' -fuzz '^FuzzRequestBody$$' -fuzztime $(FUZZTIME)
	go test ./epp -run '^$$' -fuzz '^FuzzRequestHeaders$$' -fuzztime $(FUZZTIME)
	go test ./epp/plugins/metricsource -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	go test ./apis/fleet/v1alpha1 -run '^$$' -fuzz '^FuzzParsePeerDirectory$$' -fuzztime $(FUZZTIME)
	go test ./spoke/llmisvc -run '^$$' -fuzz '^FuzzRender$$' -fuzztime $(FUZZTIME)

fuzz-long: ## The fuzz tests for FUZZLONG (10m) each, about an hour; new failing inputs land in testdata/fuzz to commit.
	$(MAKE) fuzz FUZZTIME=$(FUZZLONG)

verify-generated: ## Fail when `make manifests generate` would change a file.
	hack/verify-generated.sh

verify-layering: ## Fail when hub, spoke and picker depend on each other instead of apis/ and internal packages, or e2e/ holds more than tests.
	hack/verify-layering.sh

clean: ## Remove fleetinfer's binaries (keeps the pinned tools).
	rm -f $(addprefix $(BIN)/,epp gie-epp hub spoke localfleet)
	rm -rf $(BIN)/oci $(BIN)/oci.build
