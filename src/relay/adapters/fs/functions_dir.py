"""Whether the functions directory can be listed (``relay start`` refuses to start
without it, and ``relay health`` fails while it is gone)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["nothing_to_serve", "unreadable"]


def unreadable(functions_dir: Path) -> str | None:
    """Why ``functions_dir`` cannot be listed (``does not exist``, ...), or ``None``
    when it can. One ``scandir`` open: cheap enough for every health request."""
    try:
        with os.scandir(functions_dir):
            return None
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "is not a directory"
    except PermissionError:
        return "cannot be read (permission denied)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"


def nothing_to_serve(functions_dir: Path) -> str | None:
    """``relay health``'s line for the worker's functions directory, or ``None``."""
    problem = unreadable(functions_dir)
    return None if problem is None else f"directory {functions_dir} {problem}: nothing to serve"
