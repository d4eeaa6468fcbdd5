# Relay's own image: `relay start` in a container that never sees the Docker socket (it
# reaches the engine through the socket proxy of compose.dev.yaml; docs/deployment.md).
#
#   docker build -t relay:latest --build-arg RELAY_COMMIT=$(git rev-parse --short HEAD) .
#
# Multi-stage for the classic builder (no BuildKit, no RUN --mount): the first stage builds
# the wheel with the locked build backend, the second installs it with exactly the locked
# runtime set (requirements-runtime.lock, every file hash-checked) and nothing else.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.12.17
ARG PYTHON_IMAGE=python:3.14-slim

FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS wheel
COPY --from=uv /uv /usr/local/bin/uv
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY src ./src
# hatchling and its dependencies at the pins and hashes of requirements.lock
RUN uv build --wheel --no-cache --require-hashes --build-constraints requirements.lock \
        --out-dir /dist . \
 && ls /dist/relay-*.whl

FROM ${PYTHON_IMAGE}
ARG RELAY_VERSION=0.1.0
ARG RELAY_COMMIT=
ARG RELAY_SOURCE=local-checkout
LABEL org.opencontainers.image.title="relay" \
      org.opencontainers.image.description="Event-driven function runner: Redis Streams in, hardened warm Docker containers out" \
      org.opencontainers.image.source="${RELAY_SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${RELAY_VERSION}" \
      org.opencontainers.image.revision="${RELAY_COMMIT}"
# git and ssh for `relay git sync` (docs/git.md); tini reaps and forwards SIGTERM.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        git openssh-client tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=uv /uv /usr/local/bin/uv
COPY requirements-runtime.lock /tmp/requirements-runtime.lock
COPY --from=wheel /dist/ /tmp/dist/
RUN uv pip install --system --no-cache --require-hashes -r /tmp/requirements-runtime.lock \
 && uv pip install --system --no-cache --no-deps /tmp/dist/relay-*.whl \
 && rm -rf /tmp/dist /tmp/requirements-runtime.lock /usr/local/bin/uv \
 && test "$(relay --version | cut -d' ' -f2)" = "${RELAY_VERSION}"
# Relay runs unprivileged: it needs the proxy's TCP endpoint, never the socket. Its
# state directory is a volume (a new named volume takes this ownership); /run/relay
# and /tmp are tmpfs mounts in compose.dev.yaml because the root filesystem is read-only.
RUN groupadd --gid 10000 relay \
 && useradd --uid 10000 --gid relay --no-create-home --home-dir /var/lib/relay \
        --shell /usr/sbin/nologin relay \
 && mkdir -p /functions /var/lib/relay /run/relay \
 && chown relay:relay /var/lib/relay /run/relay \
 && chmod 0700 /var/lib/relay
ENV RELAY_COMMIT=${RELAY_COMMIT} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
VOLUME ["/var/lib/relay"]
USER relay:relay
WORKDIR /var/lib/relay
HEALTHCHECK --interval=5s --timeout=30s --start-period=30s --retries=3 CMD ["relay", "health"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["relay", "start"]
