# syntax=docker/dockerfile:1
#
# holdfast container image.
#
#   docker build --build-arg HOLDFAST_COMMIT="$(git rev-parse --short=12 HEAD)" -t holdfast .
#   docker run --rm -p 8080:8080 -e HOLDFAST_UPSTREAM=http://mcp-backend:8000 holdfast
#
# Build: the official Rust image compiles the release binary with the same command .ci/run runs
# (tests/it/deploy_image.rs checks that they stay equal), linked statically against glibc
# (`+crt-static`; a musl toolchain cannot be installed where CI runs). Run: distroless `static`
# (CA certificates, /etc/passwd, tzdata; no shell, no libc, no package manager) as the non-root
# user 65532: about 2 MB plus the 7 MB binary.
#
# glibc's resolver is built into the static binary: /etc/hosts and DNS (Docker's embedded DNS
# for service names included) work without any shared library, as holdfast needs, since it
# resolves the upstream name again for every new connection. For a dynamically linked build on
# `gcr.io/distroless/cc-debian12:nonroot` instead (about 30 MB), drop RUSTFLAGS and `--target`
# from the build command (in .ci/run too) and copy target/release/holdfast.

ARG RUST_VERSION=1.95

# The commit the image is built from: `.git` is not in the build context, so build.rs reads it
# from here (holdfast_build_info and the image's revision label; `unknown` without it).
ARG HOLDFAST_COMMIT=unknown

FROM rust:${RUST_VERSION}-slim-bookworm AS build
ARG HOLDFAST_COMMIT
ENV HOLDFAST_COMMIT=${HOLDFAST_COMMIT}
WORKDIR /src
COPY . .
# Cache mounts keep the crates.io downloads and the target directory between builds; the binary
# is copied out of the cached target directory in the same step, since the cache is not part of
# the image. `--target` keeps crt-static off build scripts and proc-macros (they must stay
# dynamic); `uname -m` makes it x86_64 or aarch64, whichever platform is being built.
# `-Cprofile-use`: a profile-guided build, from pgo/holdfast.profdata (made by benches/pgo.sh with
# this RUST_VERSION on x86_64; about 0.9 x the CPU per request of a build without it). On aarch64
# the functions whose code differs by architecture find no counts and are built as without it
# (the build prints a `hash mismatch` warning for each).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS="-C target-feature=+crt-static -Cprofile-use=$PWD/pgo/holdfast.profdata" cargo build --release --locked --target "$(uname -m)-unknown-linux-gnu" \
    && install -D -m 0755 "target/$(uname -m)-unknown-linux-gnu/release/holdfast" /out/holdfast

FROM gcr.io/distroless/static-debian12:nonroot
ARG HOLDFAST_COMMIT
# The OCI annotations registries and scanners read (the version is Cargo.toml's: a test keeps
# them equal).
LABEL org.opencontainers.image.title="holdfast" \
      org.opencontainers.image.description="A reverse-proxy sidecar that keeps MCP clients connected while their backend container is recreated" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${HOLDFAST_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/holdfast /usr/local/bin/holdfast
# Numeric, so Kubernetes' runAsNonRoot can verify it (distroless' `nonroot`).
USER 65532:65532
# The image's configuration: the admin listener on every interface, so that the orchestrator's
# probes and Prometheus reach /readyz, /healthz and /metrics from outside the container. A file,
# not an ENV: the environment beats a file, and an ENV would silently override the `admin` of a
# file you mount. Your own file (mounted here, or named by HOLDFAST_CONFIG) replaces it.
COPY deploy/docker/holdfast.toml /etc/holdfast/holdfast.toml
ENV HOLDFAST_CONFIG=/etc/holdfast/holdfast.toml
# 8080: proxy (MCP clients). 9362: admin (/metrics, /healthz, /readyz).
EXPOSE 8080 9362
# No curl in a distroless image: `holdfast healthcheck` asks the configured admin listener's
# /readyz and exits 0 (ready) or 1. The exec form, since there is no shell. During the start
# period it checks every second (`--start-interval`, Docker Engine 25 and later): holdfast is
# ready in milliseconds, and Traefik routes to a container only once it is healthy, so a
# restarted holdfast would otherwise leave Traefik answering 404 for up to 10 s.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --start-interval=1s --retries=3 \
    CMD ["/usr/local/bin/holdfast", "healthcheck"]
# SIGTERM (what `docker stop` sends) makes holdfast drain for shutdown.drain_timeout_secs (20 s):
# give it a longer stop timeout (`docker stop -t 30`, compose `stop_grace_period: 30s`).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/holdfast"]
