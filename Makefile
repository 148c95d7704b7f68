# str — secure tool runtime. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/str
# The worker (cmd/str-worker: cgo, the Solace client library), beside str:
# `str worker` execs it from str's own directory.
WORKER_BIN := bin/str-worker
# The egress helper (cmd/str-egress: static): every launcher runs it, as
# nobody when root, from str's own directory to serve its sandboxes' network.
EGRESS_BIN := bin/str-egress
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin

# Lint tools, pinned by module version (the proxy serves module versions, not
# release tags: staticcheck 2026.2.2 is honnef.co/go/tools v0.8.2) and
# installed into bin/tools so that a tool elsewhere on PATH is never used;
# scripts/install-tool.sh skips one already there at its version. deadcode
# is taken from golang.org/x/tools v0.51.0, the x/tools staticcheck v0.8.2
# is built with: the x/tools packages both link compile once.
TOOLS       := $(CURDIR)/bin/tools
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOVULNCHECK := golang.org/x/vuln/cmd/govulncheck@v1.9.0
DEADCODE    := golang.org/x/tools/cmd/deadcode@v0.51.0

# The object stores the artifact stores' tests start (worker/artifacts finds
# them on PATH, else in bin/tools): versitygw, a POSIX-backed S3 gateway, for
# ARTIFACT_SERVICE_TYPE=s3, and fake-gcs-server, a GCS emulator, for gcs.
# Built from the module proxy into bin/tools once (about 5 minutes together
# on 2 cores); install-tool.sh then skips them.
VERSITYGW     := github.com/versity/versitygw/cmd/versitygw@v1.8.0
FAKEGCSSERVER := github.com/fsouza/fake-gcs-server@v1.56.1

# The worker image's one tag: make image builds it, test/container runs it
# (STR_IMAGE), docs/deployment.md names it.
IMAGE := str-worker:dev

.PHONY: help deps init build run demo test test-unit test-unit-plain test-unit-race test-fuzz test-integration test-integration-host test-integration-template test-vm test-container test-docker test-systemd test-pod test-fleet test-deps test-tools image fuzz bench bench-egress bwrap-suite lint lint-gofmt lint-vet lint-staticcheck lint-deadcode lint-govulncheck tools clean

help:
	@echo "make run     build and start str worker with the embedded broker on 127.0.0.1:55554 (the main job; BROKER_PORT=N for another port)"
	@echo "make test    every test: unit, fuzz (12 s a target), host integration (as root), cgroup v2 in a VM, the image in docker, systemd, a pod and a fleet;"
	@echo "             every phase runs even when one fails; the run then fails and its last line names each failed phase"
	@echo "make image   the worker image $(IMAGE) from a locally built Debian 12 base (no registry; docker, root)"
	@echo "make demo    scripted tour against a running 'make run' (BROKER=HOST:PORT for a broker elsewhere than 127.0.0.1:55554)"
	@echo "make fuzz    every go test -fuzz target for FUZZTIME each (default 20s; e.g. FUZZTIME=10m)"
	@echo "make bench   str-bench: str vs bubblewrap, the clone floor, python3 -c pass and under load (BENCH_ARGS=--quick)"
	@echo "make bench-egress  the egress proxy's terminated path vs direct vs tunnel over a shaped veth link (root; BENCH_ROUNDS=15)"
	@echo "make bwrap-suite  bubblewrap's own tests with the machine's bwrap and with str bwrap, counts side by side"
	@echo "make lint    gofmt, go vet, staticcheck, deadcode, govulncheck (tools pinned in bin/tools; govulncheck only when its database is reachable or GOVULNDB names a copy)"

# What a fresh Debian 12 machine lacks: libseccomp headers for cgo, python3
# for tools, python3-pip (pip runs inside the installation sandbox for a
# tool's declared package), util-linux (setpriv for the rootless test), and
# the Go modules.
deps:
	@missing=""; \
	for p in libseccomp-dev python3 python3-pip util-linux gcc; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 1; fi; \
	fi
	$(GO) mod download

# No binary is committed and there is no second program to embed: every
# sandbox runs the init's steps in the launcher's own clone child
# (nsinit's compiled program). str is built with CGO_ENABLED=0 (static, no C: `str run` pays for no
# worker code, issue 19); the worker, with the Solace client library's
# cgo, is bin/str-worker beside it, built without the GCS client's gRPC
# path (WORKER_TAGS: the worker speaks GCS's JSON API; measured: 72.7 to
# 53 MB, its decode-profiles 56 to 40 MB of RSS).
WORKER_TAGS := disable_grpc_modules
build: deps
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/str
	CGO_ENABLED=0 $(GO) build -o $(EGRESS_BIN) ./cmd/str-egress
	$(GO) build -tags $(WORKER_TAGS) -o $(WORKER_BIN) ./cmd/str-worker

# make run BROKER_PORT=N: the embedded broker on 127.0.0.1:N instead.
BROKER_PORT ?= 55554

run: build
	BROKER_PORT=$(BROKER_PORT) STR_BIN=$(CURDIR)/$(BIN) ./scripts/run.sh

# make demo BROKER=HOST:PORT: against a worker's broker elsewhere than
# 127.0.0.1:55554 (e.g. the one of make run BROKER_PORT=N); make passes a
# variable set on its command line to the script's environment.
demo:
	./scripts/demo.sh


# The phases run in this order, each timed (scripts/phases.sh prints the
# table at the end). A failed phase does not stop the run: every phase
# runs, the run fails, and the table's last line names every failed phase.
# The container phases need the image (:image): when it fails they are
# listed as not run.
test: deps build test-deps test-tools
	@MAKE="$(MAKE)" ./scripts/phases.sh '&image' test-unit test-fuzz test-integration test-vm image bwrap-suite \
	  test-docker:image test-systemd:image test-pod:image test-fleet:image

# What only the test phases need, installed up front (as root) so that the
# image built in the background and the VM phase never run apt-get at the
# same time: qemu, a static busybox and xz for the VM, debootstrap for the
# image's base, bubblewrap for `str bwrap`'s side-by-side tests, procps for
# the VM's process listings, numpy for the template reseed test, strace for
# the tests that count a run's system calls; capsh, dpkg-source and
# python3's seccomp module for bubblewrap's own suite (make bwrap-suite);
# runsc for the runtime class gvisor (test/integration's runtime_gvisor_test.go).
test-deps:
	@missing=""; \
	for p in qemu-system-x86 busybox-static xz-utils debootstrap bubblewrap curl procps python3-numpy strace libcap2-bin dpkg-dev python3-seccomp runsc; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 1; fi; \
	fi

# Unit tests of every package (real namespaces, seccomp, cgroup v1
# fallback where a unit needs them); privileged ones skip with the reason
# unless STR_MUST_WORK=1. The trusted core, the worker and internal/ run
# under the race detector only (one run each, not two).
# Two runs, each a target of its own so that make -k (scripts/phases.sh)
# runs the race run also when the plain one fails.
test-unit: test-unit-plain test-unit-race

test-unit-plain:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v -e /test/ -e /worker -e /launcher -e /nsinit -e /internal/)

test-unit-race: test-tools
	$(GO) test -count=1 -race ./worker/... ./launcher/... ./nsinit/... ./internal/...

# The fuzz targets (scripts/fuzz.sh lists them all, each with its seed
# corpus in testdata/fuzz/): test-fuzz runs the ones marked ci for 12 s
# each within make test; make fuzz runs every one for FUZZTIME.
FUZZTIME ?= 20s

test-fuzz:
	FUZZTIME=12s GO=$(GO) ./scripts/fuzz.sh --ci

fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) ./scripts/fuzz.sh

# Two runs (targets of their own, for make -k as test-unit's): the host
# packages of test/, then the hostile battery again with every tool served
# from a per-tool template (issue 20: every case must hold in template mode
# too; the battery fails if a call fell back cold). After the first run,
# not beside it: both use the battery's test network (make, without -j,
# runs prerequisites one after the other, in this order).
test-integration: test-integration-host test-integration-template

test-integration-host: build
	STR_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 20m $$($(GO) list ./test/... | grep -v -e /test/container -e /test/pod -e /test/systemd -e /test/fleet)

test-integration-template: build
	STR_BIN=$(CURDIR)/$(BIN) STR_HOSTILE_TEMPLATE=1 $(GO) test -count=1 -timeout 15m ./test/integration/hostile/

# The worker image (scripts/image.sh): a Debian 12 base made by debootstrap
# and docker import (reused while its recipe is unchanged), then the
# Dockerfile with the host-built bin/str. No registry is needed.
image: build
	IMAGE=$(IMAGE) ./scripts/image.sh

# The image in the engines (each a phase of make test of its own, so the
# table shows each): test-docker, the image run in Docker with the least
# privileges that work (deploy/docker/), serving calls through the
# published broker port, and the documented docker run line as written;
# test-systemd, the unit under systemd as PID 1; test-pod, the Kubernetes
# Deployment's constraints; test-fleet, a broker and three workers.
# test-container runs all four (with -k, all four also when one fails).
test-container: test-docker test-systemd test-pod test-fleet

ENGINE_TEST = STR_BIN=$(CURDIR)/$(BIN) STR_IMAGE=$(IMAGE) $(GO) test -count=1 -timeout 15m

test-docker: image
	$(ENGINE_TEST) ./test/container/

test-systemd: image
	$(ENGINE_TEST) ./test/systemd/

test-pod: image
	$(ENGINE_TEST) ./test/pod/

test-fleet: image
	$(ENGINE_TEST) ./test/fleet/

# cgroup v2 for real, in a QEMU guest with a pure v2 hierarchy: the
# TestCgroupV2 set, then the whole hostile battery (with KVM; under TCG only
# when STR_VM_BATTERY=1 asks, see scripts/test-vm.sh).
test-vm: build
	./scripts/test-vm.sh

# str-bench (cmd/str-bench, a program of its own so that bin/str carries no
# benchmark code) measuring bin/str: the whole interleaved comparison (a few
# minutes; BENCH_ARGS=--quick for the one-minute run). Installs bubblewrap
# when it is missing (as root).
bench: build
	$(GO) build -o bin/str-bench ./cmd/str-bench
	STR_BIN=$(CURDIR)/$(BIN) STR_BENCH_BIN=$(CURDIR)/bin/str-bench ./scripts/bench.sh $(BENCH_ARGS)

# The egress proxy on a real link (egress BenchmarkTerminatedLink): the
# HTTPS server in a network namespace behind a shaped veth pair, reached
# directly, through a terminated connection and through the tunnel,
# interleaved. Root (it creates and removes the namespace and the pair).
BENCH_ROUNDS ?= 15

bench-egress:
	STR_MUST_WORK=1 $(GO) test -count=1 -run '^$$' -bench BenchmarkTerminatedLink -benchtime $(BENCH_ROUNDS)x -timeout 30m ./egress

# bubblewrap's own tests (from the Debian source package of the installed
# bwrap, never stored here), each file as it is and rewritten to count every
# test, run with the machine's bwrap and with str bwrap in the same run, as
# root and as uid 65534 (no cgroup set up for it): counts side by side, the
# tests that pass under bwrap and not under str, and the ratchet on them
# (test/bwrap-suite/known-differences.txt: fails on a new one and on a listed
# one that now passes). scripts/bwrap-suite.sh; docs/bwrap.md, "bubblewrap's
# own test suite". Installs bubblewrap and the tests' tools when missing.
bwrap-suite: build
	STR_BIN=$(CURDIR)/$(BIN) ./scripts/bwrap-suite.sh

# Each tool is a target of its own, timed (CI reads where lint's time
# goes; .ci/run's make -k lint runs every tool also when one fails). go vet
# and staticcheck compile the packages' export data into GOCACHE: on a cold
# cache that is most of their time, and the build and the unit tests of the
# same run reuse it (measured: the unit tests' compile fell from 102 to 25
# CPU-seconds after go vet). staticcheck keeps its analyses in its own
# cache ($$XDG_CACHE_HOME/staticcheck), so a second run re-analyses only
# what changed. govulncheck is built and run only when its database is
# reachable (scripts/vulncheck.sh says when it is not: it has no offline
# mode without a copy, GOVULNDB).
lint: lint-gofmt lint-vet lint-staticcheck lint-deadcode lint-govulncheck

lint-gofmt:
	@t=$$(date +%s); out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi; echo "lint: gofmt $$(( $$(date +%s) - t )) s"

lint-vet:
	@t=$$(date +%s); $(GO) vet ./... && echo "lint: go vet $$(( $$(date +%s) - t )) s"

lint-staticcheck: tools
	@t=$$(date +%s); $(TOOLS)/staticcheck ./... && echo "lint: staticcheck $$(( $$(date +%s) - t )) s"

lint-deadcode: tools
	@t=$$(date +%s); ./scripts/deadcode.sh $(TOOLS)/deadcode && echo "lint: deadcode $$(( $$(date +%s) - t )) s"

lint-govulncheck:
	@t=$$(date +%s); GO=$(GO) ./scripts/vulncheck.sh $(TOOLS) $(GOVULNCHECK) && echo "lint: govulncheck $$(( $$(date +%s) - t )) s"

test-tools:
	@t=$$(date +%s); for tool in $(VERSITYGW) $(FAKEGCSSERVER); do GO=$(GO) ./scripts/install-tool.sh $(TOOLS) $$tool || exit; done; echo "test-tools: $$(( $$(date +%s) - t )) s"

tools:
	@t=$$(date +%s); for tool in $(STATICCHECK) $(DEADCODE); do GO=$(GO) ./scripts/install-tool.sh $(TOOLS) $$tool || exit; done; echo "lint: tools $$(( $$(date +%s) - t )) s"

clean:
	rm -rf bin var
