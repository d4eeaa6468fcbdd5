"""The in-container bootstraps: one long-lived process per warm container.

Protocol (version ``BOOTSTRAP_VERSION``), one request at a time:

* Relay writes one request per line on the container's stdin: a JSON object
  ``{"id": nonce, "handler": ..., "env": {...}, "event": "<event JSON text>",
  "timeout_s": float}``, plus ``"want_result": true`` when the return value is wanted.
* The handler's stdout and stderr both go to the container's stderr stream.
* The bootstrap answers with ONE frame, written on that same stderr stream
  right after flushing the handler's output:
  ``\\x1erelay-end:<nonce>{"ok": bool, "error": str}\\n``; when the request
  said ``"want_result": true`` (``relay function run``/``invoke``; delivery never
  does), a handler that succeeded and returned something other than
  None/null/undefined adds
  ``"result"``: the value's JSON text (ASCII), at most ``RESULT_MAX_BYTES`` of
  ``relay.domain.execution``, and ``"result_size"``, the full text's length,
  when it was cut (a value that is not JSON is sent as its repr/String, a JSON
  string). Stream order means
  every line the handler printed reaches Relay before the answer does; the
  nonce (which the handler never sees) means a handler cannot forge one. A
  frame may start mid-line (after a partial line the handler left); anything
  without the request's nonce is output, never a result.
* Nothing of the protocol travels on the stdout stream: whatever arrives
  there (a stray write to fd 1) is output.
* When ``RELAY_CHANNEL`` names a socket (Relay's, mounted into the container;
  see ``relay.adapters.docker.direct``), the bootstrap connects to it before
  serving and takes requests there too. The Python bootstrap then answers on
  the socket, each answer carrying ``"out"``: how many bytes it had written to
  stderr by then, so Relay can wait for that output first. The Node bootstrap
  keeps answering on stderr: it cannot count what raw writes and child
  processes print (Node has no ``pipe()`` or ``fork()``). A bootstrap that
  cannot connect serves stdin only and says why, once, in an extra
  ``"channel"`` field of its first answer.
* The bootstrap exits on stdin EOF (or the socket's), when no request arrives
  within the idle deadline (``RELAY_IDLE_DEADLINE_S``), and kills itself when
  one request runs past its timeout plus ``RELAY_GRACE_S``: an orphaned
  container stops by itself.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

BOOTSTRAP_VERSION: Final = "8"

_FILES: Final = {
    "python3.14": ("python_bootstrap.py", "/relay/bootstrap.py", ["python", "-u"]),
    "node24": ("node_bootstrap.mjs", "/relay/bootstrap.mjs", ["node"]),
}

# starts an answer frame; the nonce and the JSON answer follow, then a newline
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
