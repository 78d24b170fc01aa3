# reconciler: multi-stage build of the release binary onto a slim runtime.
#
#   docker build -t reconciler:local .
#   docker run --rm reconciler:local --help
#
# The builder runs the same two scripts as CI (scripts/setup.sh --build,
# then scripts/build.sh), so the image holds the binary the tests proved.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY scripts/ scripts/
RUN scripts/setup.sh --build
COPY . .
ENV CARGO_TARGET_DIR=/src/target
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    scripts/build.sh && cp /src/target/release/reconciler /usr/local/bin/reconciler

FROM debian:bookworm-slim
# libssl3: librdkafka's TLS; curl: the container health check on /readyz.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/reconciler --create-home reconciler
COPY --from=build /usr/local/bin/reconciler /usr/local/bin/reconciler
COPY schemas/ /usr/share/reconciler/schemas/
COPY deploy/reconciler.toml /etc/reconciler/reconciler.toml
USER reconciler
WORKDIR /var/lib/reconciler
ENV RECONCILER_CONFIG_FILE=/etc/reconciler/reconciler.toml
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD curl -fsS http://127.0.0.1:9464/readyz || exit 1
ENTRYPOINT ["reconciler"]
CMD ["run"]
