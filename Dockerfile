# str worker image. Two stages: "build" compiles str with cgo (libseccomp,
# the Solace C library bundled with solace.dev/go/messaging); "runtime" is
# Debian slim with what the worker and the sandboxes need at run time.
#
# Build:   docker build -t str-worker .
#          docker build --build-arg STR_USER=str -t str-worker:rootless .
# Run:     see docs/deployment.md (the sandbox needs namespaces, an unmasked
#          /proc and a writable cgroup subtree: plain `docker run` is not
#          enough).
#
# This file is checked by test/deploy (parsed, not built: the machines str
# is developed on have no container engine).

ARG GO_VERSION=1.26

# ---- build ---------------------------------------------------------------
FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libseccomp-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Modules first, so that a source change does not re-download them.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -o /out/str ./cmd/str

# ---- runtime -------------------------------------------------------------
FROM debian:bookworm-slim AS runtime
# python3: runs the tools. libseccomp2: str links it (policy files; the
# sandbox's init does not). libssl3 and ca-certificates: TLS to the Solace
# broker (tcps://).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libseccomp2 libssl3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/str /usr/local/bin/str

# Non-root option: build with --build-arg STR_USER=str to run the worker as
# uid 10001 (rootless mode: needs user namespaces and a delegated cgroup
# subtree, docs/deployment.md). The default is root inside the container,
# the production case (still confined by the container's own namespaces).
ARG STR_USER=root
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/str --create-home --shell /usr/sbin/nologin str \
 && mkdir -p /tools/python /sandbox/work /sandbox/runner /sandbox/site /sam/artifacts \
 && chown str:str /sandbox/work /sandbox/runner /sandbox/site /sam/artifacts

# Artifacts go to the filesystem store, the layout agents share (mount a
# volume at /sam/artifacts); its audit log is /sam/artifacts/.audit/
# audit.jsonl (ARTIFACT_AUDIT_LOG). The in-memory store (memory) is for
# tests: agents never see it. Health and metrics listen on 127.0.0.1 (the
# HEALTHCHECK below runs inside the container); set HEALTH_ADDR=0.0.0.0 to
# publish the port.
ENV MANIFEST_PATH=/tools/manifest.yaml \
    TOOLS_PYTHON_DIR=/tools/python \
    SANDBOX_PYTHON_BIN=/usr/bin/python3 \
    SANDBOX_WORK_DIR=/sandbox/work \
    ARTIFACT_SERVICE_TYPE=filesystem \
    ARTIFACT_BASE_PATH=/sam/artifacts \
    HEALTH_PORT=8081

USER ${STR_USER}
EXPOSE 8081
STOPSIGNAL SIGTERM
# No curl in slim: python3 is there anyway. /healthz is 200 while the
# process serves; readiness (/readyz, broker connected) is for
# orchestrators that route traffic, which a worker does not receive. The
# check follows HEALTH_PORT and HEALTH_ADDR as the worker sees them at run
# time (docker run -e ...): 127.0.0.1 unless HEALTH_ADDR names one
# address; HEALTH_PORT=0 (no health server) leaves nothing to check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python3", "-c", "import os, sys, urllib.request\nport = os.environ.get('HEALTH_PORT') or '8081'\nif port == '0': sys.exit(0)\nhost = os.environ.get('HEALTH_ADDR') or '127.0.0.1'\nif host in ('0.0.0.0', '::', '[::]'): host = '127.0.0.1'\nif ':' in host and not host.startswith('['): host = '[' + host + ']'\nsys.exit(0 if urllib.request.urlopen('http://%s:%s/healthz' % (host, port), timeout=2).status == 200 else 1)"]
# str worker is PID 1: it handles SIGTERM (drains, then exits) and reaps its
# own children; each sandbox has its own PID 1 (nsinit).
ENTRYPOINT ["/usr/local/bin/str", "worker"]
