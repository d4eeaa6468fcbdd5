"""Pinned external images and tools. One place, so a bump is one line."""

from __future__ import annotations

PYTHON_BASE_IMAGE = "python:3.14-slim"
NODE_BASE_IMAGE = "node:24-alpine"
UV_IMAGE = "ghcr.io/astral-sh/uv:0.12.17"
ESBUILD_VERSION = "0.28.2"
