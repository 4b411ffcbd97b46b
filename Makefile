# fleetinfer — see README.md. `make demo` and `make test` do all set-up.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
export GOFLAGS := -buildvcs=false
export CGO_ENABLED := 0

ROOT := $(abspath .)
BIN := $(ROOT)/bin
DURATION ?= 60s
SPOKES ?= 3
TEST_TIMEOUT ?= 40m

# Tool versions come from the pinning modules under hack/tools; each tool is
# built once per version into bin/<tool>-<version>/ and reused afterwards.
modversion = $(shell awk '$$1=="require" {$$1=""; $$0=$$0} $$1=="$(2)" {print $$2}' hack/tools/$(1)/go.mod)
KUBE_VERSION := $(call modversion,kube,k8s.io/kubernetes)
ETCD_VERSION := $(call modversion,etcd,go.etcd.io/etcd/server/v3)
SIM_VERSION := $(call modversion,sim,github.com/llm-d/llm-d-inference-sim)
CONTROLLER_GEN_VERSION := $(call modversion,controller-gen,sigs.k8s.io/controller-tools)

KUBE_DIR := $(BIN)/kube-$(KUBE_VERSION)
KUBE_BINS := $(addprefix $(KUBE_DIR)/,kube-apiserver kube-controller-manager kube-scheduler kubectl)
ETCD := $(BIN)/etcd-$(ETCD_VERSION)/etcd
SIM := $(BIN)/sim-$(SIM_VERSION)/llm-d-inference-sim
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(word 1,$(subst ., ,$(KUBE_VERSION:v%=%))) \
	-X k8s.io/component-base/version.gitMinor=$(word 2,$(subst ., ,$(KUBE_VERSION:v%=%)))

.PHONY: all tools build test unit e2e demo vet fmt manifests generate verify-generated clean help

all: build

help: ## List targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

tools: $(KUBE_BINS) $(ETCD) $(SIM) $(CONTROLLER_GEN) ## Build the pinned control plane, simulator and generators (once per version).

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

$(CONTROLLER_GEN):
	@echo "==> building controller-gen $(CONTROLLER_GEN_VERSION)"
	cd hack/tools/controller-gen && go build -trimpath -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

build: ## Build fleetinfer's binaries into bin/.
	go build -o $(BIN)/ ./cmd/...

test: tools build vet verify-generated ## Build everything and run every test.
	go test -timeout $(TEST_TIMEOUT) -count=1 ./...

demo: tools build ## Run the local fleet demo (DURATION=60s SPOKES=3).
	$(BIN)/localfleet --duration $(DURATION) --spokes $(SPOKES)

vet: ## go vet and gofmt.
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

manifests: $(CONTROLLER_GEN) ## Generate fleetinfer's CRDs; copy third-party CRDs from the pinned modules.
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(CONTROLLER_GEN) crd paths=./apis/... output:crd:dir=$$tmp && \
	rm -f apis/crds/*.yaml && go run ./hack/crdgen $$tmp apis/crds
	hack/sync-crds.sh

generate: $(CONTROLLER_GEN) ## Generate deepcopy code.
	$(CONTROLLER_GEN) object paths=./apis/...

verify-generated: ## Fail when `make manifests generate` would change a file.
	hack/verify-generated.sh

clean: ## Remove fleetinfer's binaries (keeps the pinned tools).
	rm -f $(addprefix $(BIN)/,epp hub spoke localfleet)
