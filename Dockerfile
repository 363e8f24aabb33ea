# syntax=docker/dockerfile:1
# One image runs every runlease process: `runlease worker`, `runlease api`,
# `runlease operator` and `runlease migrate` (ENTRYPOINT runlease; the Helm
# chart and the operator pass the subcommand as args).
#
#   docker build -t runlease:0.1.0 .
#   docker run --rm runlease:0.1.0 worker --help
#
# scripts/build-image builds it with docker, buildah or podman (and, where no
# registry is reachable, on a python-base:3.11 made from Debian's packages),
# CI runs it through tests/image, and tests/chart/test_dockerfile.py reads
# this file. docs/deploy.md tells how.

ARG PYTHON_IMAGE=python:3.11-slim

# -- build: the wheel, exactly as `python -m pip wheel --no-deps -w /dist .` ---------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is made of (.dockerignore keeps the rest out of the context).
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-deps -w /dist .

# -- runtime: the wheel and its dependencies in a virtualenv; no compilers ----------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="runlease" \
      org.opencontainers.image.description="A durable PostgreSQL run queue for AI agent runs: worker, API, Kubernetes operator and migrations in one image" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/runlease \
    PATH=/opt/runlease/bin:$PATH
# Every dependency ships manylinux wheels (psycopg[binary] included), so
# nothing is compiled here. The wheel is bind-mounted from the build stage:
# it never becomes a layer of this image.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    python -m venv "$VIRTUAL_ENV" \
    && "$VIRTUAL_ENV/bin/pip" install --no-compile "$(echo /dist/*.whl)[openai,otel]" \
    && "$VIRTUAL_ENV/bin/pip" check \
    && runlease --version
# bubblewrap: every tool call runs in a sandbox of its own (worker/sandbox.py,
# docs/security.md); prlimit and setpriv come with util-linux, which the base has.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/* \
    && bwrap --version
# A fixed numeric uid: Kubernetes' runAsNonRoot (set on the operator's worker
# pods and by the chart) can only verify a numeric USER.
RUN groupadd --system --gid 10001 runlease \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/runlease \
       --create-home --shell /usr/sbin/nologin runlease
WORKDIR /home/runlease
USER 10001:10001
# 8080: `runlease api`; 9464: worker /metrics and probes; 9465: operator's.
EXPOSE 8080 9464 9465
ENTRYPOINT ["runlease"]
CMD ["--help"]
