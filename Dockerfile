# syntax=docker/dockerfile:1.7
#
# The aggregation-gateway image: a multi-stage build with a small, non-root runtime.
#
#   docker build -t ghcr.io/aggregation-gateway/aggregation-gateway:0.1.0 .
#
# Runtime: glibc on gcr.io/distroless/cc-debian12:nonroot (libc, libgcc, CA certificates, tzdata; no
# shell, no package manager). The binary is dynamically linked against glibc only: TLS is rustls with
# the ring provider (no OpenSSL, no aws-lc), so nothing else is needed at runtime. glibc rather than a
# static musl build because musl's allocator is markedly slower under the many small allocations of a
# proxy. The image runs as uid/gid 65532 ("nonroot"), matching the Helm chart's securityContext;
# tests/tests/suite/dockerfile.rs parses this file and keeps USER and EXPOSE in step with the chart.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
WORKDIR /src
# The whole workspace is needed for Cargo to load it (every member's manifest), but only the gateway
# binary and what it depends on are compiled.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --locked --release -p aggregation-gateway --bin aggregation-gateway \
 && install -D -m 0755 target/release/aggregation-gateway /out/aggregation-gateway

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title="aggregation-gateway" \
      org.opencontainers.image.description="A front proxy that aggregates Kubernetes-style API servers the way kube-aggregator does." \
      org.opencontainers.image.source="https://github.com/aggregation-gateway/aggregation-gateway" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/aggregation-gateway /usr/local/bin/aggregation-gateway
USER 65532:65532
EXPOSE 8443
# Without --config the gateway runs on its embedded defaults; the chart passes
# --config=/etc/aggregation-gateway/config.yaml.
ENTRYPOINT ["/usr/local/bin/aggregation-gateway"]
