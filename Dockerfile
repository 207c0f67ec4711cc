# syntax=docker/dockerfile:1
# Sluice processor image: a static binary on distroless, running as nonroot.
#
#   make docker    # docker build -t sluice/processor:dev .
#
# Run a job from an example env file on the host's network (Linux), where the
# file's SLUICE_BROKERS=localhost:9092 is the host's broker (`processor
# broker`, say); on a network of its own the container would dial itself:
#
#   docker run -d --name aggregate-1 --network host \
#     --env-file configs/aggregate.env -e SLUICE_INSTANCE_ID=aggregate-1 \
#     -v aggregate-1-state:/var/lib/sluice sluice/processor:dev
#
# Give every replica its own SLUICE_INSTANCE_ID and state volume, and keep
# both across runs: the default instance id, the hostname, is a new container
# id at every `docker run`, which joins as a new static member while the old
# one's partitions wait out SLUICE_SESSION_TIMEOUT. To run next to the compose
# demo's broker instead (network "sluice", SLUICE_BROKERS=kafka:9092) see
# README.md, "Docker and docker compose".

# The toolchain go.mod asks for: an older cached 1.26 image would fail the
# build (the image sets GOTOOLCHAIN=local).
FROM golang:1.26.8 AS build
WORKDIR /src
# The module and build caches live in BuildKit cache mounts, kept between
# builds: a source change recompiles only what changed and downloads nothing.
# The sources are bind-mounted, not copied, so they leave no layer behind.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=bind,source=go.mod,target=go.mod \
    --mount=type=bind,source=go.sum,target=go.sum \
    go mod download
# GO_TAGS=nogcs (docker build --build-arg GO_TAGS=nogcs .) leaves out the
# gs:// savepoint driver and the Google Cloud client, a third of the binary;
# GO_TAGS=noazure the azblob:// one and the Azure SDK (7.5 MB); both:
# --build-arg GO_TAGS="nogcs noazure".
ARG GO_TAGS=
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=bind,target=. \
    CGO_ENABLED=0 go build -trimpath -tags "$GO_TAGS" -ldflags='-s -w' -o /out/processor ./cmd/processor
# The state directory must exist in the image owned by nonroot (65532): a
# named volume mounted there for the first time copies this ownership, and
# otherwise comes up root-owned and unwritable.
RUN mkdir -p /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/processor /processor
COPY --from=build --chown=65532:65532 /out/state /var/lib/sluice
ENV SLUICE_STATE_DIR=/var/lib/sluice
VOLUME /var/lib/sluice
# SLUICE_METRICS_ADDR: /metrics, /healthz, /readyz
EXPOSE 9090
USER nonroot:nonroot
# Liveness: the process serves. Readiness (in the group, tasks restored) is
# `processor healthz --ready`, which docker-compose.yml uses; a restore can
# take minutes, and docker shows a container that is not ready yet as
# unhealthy. Kubernetes ignores this and probes /healthz and /readyz itself.
# Containers running `processor generate` or `broker` serve no endpoints:
# turn the check off for them (docker-compose.yml does for the generator).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/processor", "healthz"]
ENTRYPOINT ["/processor"]
