# syntax=docker/dockerfile:1
# kube-event-bridge image: a Rust builder stage, then a small Debian runtime with only the binary
# and the libraries it links (libssl3t64, zlib) plus CA certificates, run as uid/gid 65532.
#   docker build -t kube-event-bridge:0.1.0 .
# Needs BuildKit (the default builder since Docker 23) for the cache mounts. See docs/deploy.md.
# scripts/image builds the same image without an engine; tests/integration/image.rs keeps the two
# in step (release, packages, user, binary, entrypoint, command, port).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
# librdkafka is compiled from source by rdkafka-sys (C compiler, make, perl) against the system
# OpenSSL and zlib; zstd is vendored.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl-dev zlib1g-dev pkg-config make perl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
# Every target the manifest declares must exist for cargo to load it, so benches/ and tests/ come
# along (they are not built), and so does every workspace member (consumer/, not built either).
# build.rs holds the link settings;
# .cargo/config.toml the allocator's compiled-in configuration (docs/architecture.md, "Memory").
COPY Cargo.toml Cargo.lock build.rs ./
COPY .cargo ./.cargo
COPY consumer ./consumer
COPY src ./src
COPY benches ./benches
COPY tests ./tests
COPY examples ./examples
# The dist profile (release with fat LTO, Cargo.toml) keeps debug info for profiling; the image
# does not need it.
ENV CARGO_PROFILE_DIST_DEBUG=0 \
    CARGO_PROFILE_DIST_STRIP=debuginfo
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/build/target \
    cargo build --profile dist --locked --bin kube-event-bridge \
    && install -m 0755 target/dist/kube-event-bridge /usr/local/bin/kube-event-bridge

FROM debian:${DEBIAN_RELEASE}-slim
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libssl3t64 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 keb \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin keb
COPY --from=builder /usr/local/bin/kube-event-bridge /usr/local/bin/kube-event-bridge
# Numeric, so that Kubernetes can enforce runAsNonRoot.
USER 65532:65532
# The admin server: /livez, /readyz, /metrics.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kube-event-bridge"]
CMD ["run", "--config", "/etc/kube-event-bridge/config.yaml"]
