# syntax=docker/dockerfile:1
# Sluice processor image: a static binary on distroless, running as nonroot.
#   docker build -t sluice/processor .
#   docker run --env-file configs/aggregate.env -v sluice-state:/var/lib/sluice sluice/processor

# The toolchain go.mod asks for: an older cached 1.26 image would fail the
# build (the image sets GOTOOLCHAIN=local).
FROM golang:1.26.8 AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/processor ./cmd/processor
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
ENTRYPOINT ["/processor"]
