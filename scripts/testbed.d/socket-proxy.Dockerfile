# Stand-in for tecnativa/docker-socket-proxy (no registry here). The real image is HAProxy
# with an allow-list driven by environment variables; this is Debian's HAProxy with the
# same variables, the same defaults (EVENTS, PING, VERSION on; everything else, POST
# included, off) and the same rules: a request is refused (403) unless its method is GET
# or HEAD (or POST=1), and unless its path (after an optional /v1.xx prefix) starts with
# an endpoint group whose variable is 1.
ARG BASE=relay-testbed/debian:bookworm
FROM ${BASE}
LABEL relay.test-standin=true
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
ENV ALLOW_RESTARTS=0 ALLOW_START=0 ALLOW_STOP=0 AUTH=0 BUILD=0 COMMIT=0 CONFIGS=0 \
    CONTAINERS=0 DISTRIBUTION=0 EVENTS=1 EXEC=0 GRPC=0 IMAGES=0 INFO=0 NETWORKS=0 NODES=0 \
    PING=1 PLUGINS=0 POST=0 SECRETS=0 SERVICES=0 SESSION=0 SWARM=0 SYSTEM=0 TASKS=0 \
    VERSION=1 VOLUMES=0 \
    BIND_CONFIG=":2375" SOCKET_PATH=/var/run/docker.sock LOG_LEVEL=info
COPY haproxy.cfg /usr/local/etc/haproxy/haproxy.cfg
EXPOSE 2375
STOPSIGNAL SIGUSR1
CMD ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"]
