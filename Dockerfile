# syntax=docker/dockerfile:1
#
# poolplanner: the planner and reporter binaries in one small image.
#   docker build -t poolplanner .
#   docker compose up            (see docker-compose.yaml)
#
# The build stage and the runtime share Debian bookworm, so the glibc the
# binaries link against (cgo) is the one they run on.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# CGO_ENABLED=1: go-nvml loads libnvidia-ml.so.1 with dlopen through cgo.
# Without it the reporter cannot read GPUs (and reports none).
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/planner ./cmd/reporter

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/planner /out/reporter /usr/local/bin/
COPY examples/ /usr/share/poolplanner/examples/
# /secrets and the directories compose mounts volumes on belong to the
# user the binaries run as, so that a new volume mounted there (keys and
# credentials, planner auth init) is theirs too, and owner-only.
RUN mkdir -p /secrets/keys /secrets/nats /secrets/planner /secrets/reporter \
    && chown -R 65534:65534 /secrets && chmod -R 700 /secrets
# NVML (the reporter) comes from the host: the NVIDIA container toolkit
# mounts libnvidia-ml.so.1 into containers that reserve GPUs.
ENV NVIDIA_DRIVER_CAPABILITIES=utility
USER 65534:65534
CMD ["planner", "--help"]
