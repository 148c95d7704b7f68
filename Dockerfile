# str worker image: one stage, FROM a Debian 12 base, with the str binaries
# built on the host (make build: bin/str and bin/str-worker) copied in. No Go toolchain in the
# image and nothing pulled from a registry.
#
# Build:   make image       (builds the base with debootstrap, imports it as
#                            str-base:bookworm-<recipe hash>, then this file;
#                            the tag is the Makefile's IMAGE, str-worker:dev)
# With a registry base instead:
#          make build && docker build --build-arg BASE=debian:bookworm-slim -t str-worker:dev .
#          (the RUN below installs the run-time packages the base lacks)
# Rootless: add --build-arg STR_USER=str (the worker runs as uid 10001).
# Run:     see docs/deployment.md (the sandbox needs namespaces, an unmasked
#          /proc and a writable cgroup: plain `docker run` is not enough;
#          deploy/docker/seccomp.json is the container seccomp profile).
#
# Built and run by test/container (make test-container); test/deploy checks
# this file's shape.

# The base: scripts/image.sh passes the tag of the local debootstrap image.
ARG BASE=str-base:bookworm
FROM ${BASE} AS runtime

# python3: runs the tools; python3-pip (setuptools, wheel): installs the
# packages a manifest declares (str links no libseccomp: its seccomp
# filters are generated in pure Go). libssl3 and ca-certificates: TLS to the Solace
# broker (tcps://). The local base has them already (no network needed);
# a registry base gets them from apt.
RUN pkgs="python3 python3-pip python3-setuptools python3-wheel libssl3 ca-certificates passwd"; \
    if ! dpkg -s $pkgs >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends $pkgs \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# Non-root option: build with --build-arg STR_USER=str to run the worker as
# uid 10001 (rootless mode: needs user namespaces and a delegated cgroup
# subtree, docs/deployment.md). The default is root inside the container,
# the production case (still confined by the container's own namespaces).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/str --create-home --shell /usr/sbin/nologin str \
 && mkdir -p /tools/python /sandbox/work /sandbox/runner /sandbox/site /sam/artifacts \
 && chown str:str /sandbox/work /sandbox/runner /sandbox/site /sam/artifacts

# The host-built binaries (make build): str, static (CGO_ENABLED=0), and
# the worker str-worker beside it (`str worker`, `str broker`, `str invoke`
# and `str tools` exec it from str's own directory), dynamically linked against the Debian 12 libraries above
# (the Solace client library is C): build it on Debian 12 (or a base of the
# same release).
ARG STR_BIN=bin/str
ARG STR_WORKER_BIN=bin/str-worker
# The egress helper, static, beside str: every launcher runs it (as nobody)
# to serve its sandboxes' network.
ARG STR_EGRESS_BIN=bin/str-egress
COPY ${STR_BIN} /usr/local/bin/str
COPY ${STR_WORKER_BIN} /usr/local/bin/str-worker
COPY ${STR_EGRESS_BIN} /usr/local/bin/str-egress
# The entrypoint for engines that mount the container's cgroup read-only
# (docker run --entrypoint /usr/local/bin/str-container-worker ...).
COPY deploy/docker/str-container-worker /usr/local/bin/str-container-worker

# After the layers above, so that both users share them.
ARG STR_USER=root

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
# str worker is PID 1 (str execs str-worker in the same process): it handles SIGTERM (drains, then exits) and reaps its
# own children; each sandbox has its own PID 1 (nsinit).
ENTRYPOINT ["/usr/local/bin/str", "worker"]
