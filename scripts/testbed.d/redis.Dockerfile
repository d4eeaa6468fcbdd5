# Redis 7 for the tests, from Debian's package. No persistence: a restart starts empty.
ARG BASE=relay-testbed/debian:bookworm
FROM ${BASE}
LABEL relay.test-standin=true
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/*
EXPOSE 6379
CMD ["redis-server", "--port", "6379", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
