"""The in-container bootstraps: one long-lived process per warm container.

Protocol (version ``BOOTSTRAP_VERSION``), one request at a time:

* Relay writes one request per line on the container's stdin: a JSON object
  ``{"id": nonce, "handler": ..., "env": {...}, "event": "<event JSON text>",
  "timeout_s": float}``.
* The bootstrap answers with one JSON line on its private copy of stdout:
  ``{"id": nonce, "ok": bool, "error": str}`` (preceded by a newline, which
  ends any partial line a handler left there). Only a line carrying the
  request's nonce is an answer; anything else on stdout is output. Before that it writes the end
  marker ``\\x1erelay-end:<nonce>\\n`` on stderr, so Relay knows all the
  handler's output has been forwarded.
* The handler's stdout and stderr both go to the container's stderr stream;
  only the bootstrap writes to the stdout stream, and a line there without the
  request's nonce is treated as output, never as a result.
* The bootstrap exits on stdin EOF, when no request arrives within the idle
  deadline (``RELAY_IDLE_DEADLINE_S``), and kills itself when one request runs
  past its timeout plus ``RELAY_GRACE_S``: an orphaned container stops by itself.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

BOOTSTRAP_VERSION: Final = "5"

_FILES: Final = {
    "python3.14": ("python_bootstrap.py", "/relay/bootstrap.py", ["python", "-u"]),
    "node24": ("node_bootstrap.mjs", "/relay/bootstrap.mjs", ["node"]),
}

END_MARKER_PREFIX: Final = b"\x1erelay-end:"


def _entry(runtime: str) -> tuple[str, str, list[str]]:
    try:
        return _FILES[runtime]
    except KeyError:
        raise ValueError(f"unknown runtime {runtime!r}") from None


def bootstrap_source(runtime: str) -> tuple[str, bytes]:
    """The path inside the image and the bytes of the runtime's bootstrap."""
    filename, path, _ = _entry(runtime)
    data = resources.files(__package__).joinpath(filename).read_bytes()
    return path, data


def bootstrap_command(runtime: str) -> list[str]:
    """The container command that starts the bootstrap."""
    _, path, argv = _entry(runtime)
    return [*argv, path]
