# imagepin. `make demo` and `make test` work on a bare Debian 12 machine as root:
# hack/e2e-deps.sh installs the Debian packages and builds CRI-O 1.36.3 and containerd 2.4.2
# once, and hack/kube-deps.sh the Kubernetes 1.36.3 binaries and etcd 3.6.6, hack/helm-deps.sh
# helm 3.22.0, into $(IMAGEPIN_CACHE) (default /var/cache/imagepin). `make test-versions` runs
# the end-to-end tier on the previous versions, in a cache of their own.

GO        ?= go
BIN       := $(CURDIR)/bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.1.0-dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
E2E_TIMEOUT ?= 20m

# Execution counts, not durations: a wall-clock -fuzztime can end in a spurious
# "context deadline exceeded" on Go 1.26 (golang/go#75804, fixed in 1.27). About 10 s each here.
FUZZ_PARSE ?= 100000x
FUZZ_RENDER ?= 100000x
FUZZ_RESOLVE ?= 30000x

.PHONY: all build check cross image image-push test test-unit test-e2e test-versions fuzz lint demo deps bench bench-aggregator bench-cluster bench-scale proto rpm rpm-test machineconfig manifests clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# The node daemon is a static binary for every architecture OpenShift nodes run.
cross:
	@for arch in amd64 arm64 ppc64le s390x; do \
	  echo "imagepind linux/$$arch"; \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux-$$arch/ ./cmd/imagepind ./cmd/imagepinctl || exit 1; \
	done

# The container image: imagepind, imagepinctl and imagepin-aggregator (static, built as
# for cross, and without VCS stamping so that untracked files change nothing) on an empty
# base, one OCI image index for the four architectures, written to $(IMAGE_DIR) as an OCI
# layout. No container engine: packaging/image/mkimage assembles it with fixed owners,
# modes and times (the commit's), so one commit gives one digest, which it prints.
IMAGE_DIR ?= _output/image
IMAGE_ARCHES ?= amd64 arm64 ppc64le s390x
IMAGE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image:
	@for arch in $(IMAGE_ARCHES); do \
	  echo "image binaries linux/$$arch"; \
	  CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(BIN)/image/linux-$$arch/ ./cmd/imagepind ./cmd/imagepinctl ./cmd/imagepin-aggregator || exit 1; \
	done
	$(GO) run ./packaging/image/mkimage -bin $(BIN)/image -out $(IMAGE_DIR) -arches $(shell echo $(IMAGE_ARCHES) | tr ' ' ,) \
	  -version $(VERSION) -revision $(shell git rev-parse HEAD) -epoch $(IMAGE_EPOCH)

# Push the layout written by make image (crane from go-containerregistry, a dependency):
#   make image-push IMAGE_REPO=registry.example.com/imagepin/imagepin
IMAGE_REPO ?=
image-push:
	@test -n "$(IMAGE_REPO)" || { echo "IMAGE_REPO=registry/repository needed"; exit 1; }
	$(GO) run github.com/google/go-containerregistry/cmd/crane push $(IMAGE_DIR) $(IMAGE_REPO):$(VERSION)

# What needs no compile beyond the binaries: the tree, the imports, the unit file, gofmt.
# make test vets every package inside the unit and end-to-end tiers (go test -vet=all:
# vet reads the packages as those tiers compile them, so a cold run compiles nothing
# twice for it); make lint vets on its own.
check: build
	hack/verify-tree.sh
	hack/verify-imports.sh
	hack/verify-unit.sh $(BIN)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: check
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	cd packaging/helm && $(GO) vet ./...

# Unit tier: no root, no network; with the race detector. packaging/helm is a module of
# its own (Helm's dependencies stay out of imagepind's): the chart rendered by Helm's
# engine for each preset, and helm lint. It starts no goroutine of its own, so it runs
# without the race detector: compiled as lint's vet compiled it, Helm's dependencies are
# not compiled a second time, instrumented, on a cold machine.
test-unit:
	$(GO) test -race -vet=all -count=1 ./...
	cd packaging/helm && $(GO) test -vet=all -count=1 ./...

# The document parser and the drop-in renderer, briefly.
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseSetFile$$' -fuzztime $(FUZZ_PARSE) ./pinset
	$(GO) test -run '^$$' -fuzz '^FuzzRender$$' -fuzztime $(FUZZ_RENDER) ./crio
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZ_RESOLVE) ./resolve

# One build at a time (2 cores): CRI-O and crictl, then kube-apiserver and etcd (cluster loop),
# then helm (the chart's end-to-end test).
deps:
	hack/e2e-deps.sh
	hack/kube-deps.sh
	hack/helm-deps.sh

# End-to-end tier: real registry, real CRI-O, root.
test-e2e: deps
	$(GO) test -count=1 -vet=all -tags e2e -timeout $(E2E_TIMEOUT) -v ./test/e2e/ 2>&1 | hack/test-summary.sh

test: check cross test-unit fuzz rpm-test test-e2e

# The end-to-end tier on the previous versions (not in CI, which builds only the current
# ones): CRI-O 1.34.0 with Kubernetes 1.35.4, and containerd 2.2.9, built once into
# PREV_CACHE. PREV_CRIO=v1.35.2 runs CRI-O 1.35 instead (in another PREV_CACHE).
PREV_CACHE ?= /var/cache/imagepin/previous
PREV_CRIO ?= v1.34.0
PREV_CONTAINERD ?= v2.2.9
PREV_KUBE ?= v1.35.4
test-versions:
	IMAGEPIN_CACHE=$(PREV_CACHE) CRIO_VERSION=$(PREV_CRIO) CONTAINERD_VERSION=$(PREV_CONTAINERD) hack/e2e-deps.sh
	IMAGEPIN_CACHE=$(PREV_CACHE) KUBE_VERSION=$(PREV_KUBE) hack/kube-deps.sh
	IMAGEPIN_CACHE=$(PREV_CACHE) $(GO) test -count=1 -tags e2e -timeout $(E2E_TIMEOUT) -v ./test/e2e/ 2>&1 | hack/test-summary.sh

# Benchmarks (not timed tests): writes the tables to stdout and $(BENCH_OUT). Three parts:
# test/bench (every section against real runtimes), the release-shaped set (40 images on
# two large shared base layers) on 1 and 5 real CRI-O nodes behind 100 ms / 1 MB/s with
# the shipped config, the node-local mirror and peers, and test/scalebench (sharing at
# N = 5, 50, 200 simulated nodes, the tree beside the star).
BENCH_OUT ?= bench-results.md
BENCH_FLAGS ?=
RELEASEBENCH_FLAGS ?= -sections peers -peer-set release -peer-images 40 -peer-nodes 1,5 -peer-links 100ms:1000:1
SCALEBENCH_FLAGS ?= -nodes 5,50,200 -reps 1 -modes tree,star -images 10 -base-mib 4 -layer-kib 16 -link-kbps 250 -up-kbps 2500 -down-kbps 2500 -timeout 10m
bench: build
	hack/bench-deps.sh >/dev/null
	$(GO) run ./test/bench -bin $(BIN) $(BENCH_FLAGS) | tee $(BENCH_OUT)
	$(GO) run ./test/bench -bin $(BIN) $(RELEASEBENCH_FLAGS) | tee -a $(BENCH_OUT)
	$(GO) run ./test/scalebench $(SCALEBENCH_FLAGS) | tee -a $(BENCH_OUT)

# Sharing between nodes at scale alone: N = 5, 50, 200 simulated nodes (the daemon's
# mirror and peers code over HTTPS, no runtime, 50 nodes a process) behind one shared
# registry link, in the shape where the links decide on a 2-core machine (SCALEBENCH_FLAGS
# to vary; -p5 and -release mimic the peers section of make bench).
bench-scale:
	$(GO) run ./test/scalebench $(SCALEBENCH_FLAGS)

# RUNTIME=containerd runs the same demo against a real containerd 2.4.2. The demo builds
# only what it runs (CRI-O and crictl, or containerd): the kube builds belong to make test.
RUNTIME ?= cri-o
# The demo builds only what it runs: imagepind, imagepinctl and the runtime it shows.
demo:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/imagepind ./cmd/imagepinctl
	hack/e2e-deps.sh $(RUNTIME) >/dev/null
	RUNTIME=$(RUNTIME) IMAGEPIN_BIN=$(BIN) $(GO) run ./test/demo

clean:
	rm -rf $(BIN)

# Regenerate api/imagepinv1 from its .proto (protoc from Debian, plugins from the Go
# module proxy); the generated code is committed.
proto:
	hack/proto.sh

# The aggregator at scale: 5,000 nodes with their own certificates, reporting as fast as
# they can, then paced at 5,000 reports/s (AGGBENCH_FLAGS to vary).
AGGBENCH_FLAGS ?=
bench-aggregator: build
	$(GO) run ./test/aggbench -bin $(BIN) $(AGGBENCH_FLAGS)
	$(GO) run ./test/aggbench -bin $(BIN) -rate 5000 $(AGGBENCH_FLAGS)

# The cluster loop at scale against real kube-apiserver + etcd (CLUSTERBENCH_FLAGS to vary):
# apply → file on 5,000 nodes (p50, p99), status writes during a rollout, RSS.
CLUSTERBENCH_FLAGS ?=
bench-cluster: build
	hack/kube-deps.sh >/dev/null
	$(GO) run ./test/clusterbench -bin $(BIN) $(CLUSTERBENCH_FLAGS)

# RPMs for x86_64 and aarch64 (Debian's rpmbuild; the scriptlets are written out).
rpm:
	VERSION=$(VERSION) hack/rpm.sh

# Files, modes, dependencies, static binaries, and the scriptlets run for install,
# upgrade and erase.
rpm-test: rpm
	hack/rpm-test.sh

# One MachineConfig per pool from the files the RPM ships (SETS=dir adds set files).
SETS ?=
machineconfig:
	$(GO) run ./packaging/machineconfig/render -out _output/machineconfig $(if $(SETS),-sets $(SETS))

# The cluster's manifests: the PinnedImageSet CRD, RBAC (aggregator and nodes), the
# aggregator (two replicas, a PodDisruptionBudget) with IMAGE set, and its alerting rules
# (a PrometheusRule: apply it where the Prometheus Operator runs).
IMAGE ?= quay.io/imagepin/imagepin-aggregator:$(VERSION)
manifests:
	mkdir -p _output/manifests
	cp api/v1alpha1/pinnedimagesets.yaml _output/manifests/00-crd.yaml
	for f in namespace rbac nodepolicy service networkpolicy deployment pdb prometheusrule; do sed 's|image: IMAGE|image: $(IMAGE)|' packaging/aggregator/$$f.yaml > _output/manifests/$$f.yaml; done
	ls _output/manifests/*.yaml
