# Stand-in for ghcr.io/astral-sh/uv:<pin>: only /uv and /uvx, as the real image has.
# These binaries come from the PyPI wheel (glibc builds): they run once copied into a
# glibc image (COPY --from=<this> /uv /uvx /bin/), which is how Relay uses them.
FROM scratch
LABEL relay.test-standin=true
COPY uv uvx /
