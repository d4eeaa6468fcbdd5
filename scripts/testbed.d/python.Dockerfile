# Stand-in for python:3.14-slim (no registry here). Python inside is Debian's 3.11.
ARG BASE=relay-testbed/debian:bookworm
FROM ${BASE}
LABEL relay.test-standin=true
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
RUN ln -sf /usr/bin/python3 /usr/local/bin/python && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
