"""A socket of Relay's mounted into each execution container: the requests' short way.

Through the attach stream, every request and answer passes the Docker engine
and the container's shim, which together cost more CPU than Relay and the
handler's bootstrap combined. So when the engine runs on this host, Relay
listens on a Unix socket in a directory of its own per container, bind-mounts
that directory read-only into the container, and the bootstrap connects to it
before it serves. Requests then go over the socket. The Python bootstrap
answers there too, each answer counting the output written before it, which
Relay waits for on the attach stream; the Node bootstrap keeps answering on
stderr after the output (see ``relay.adapters.docker.bootstraps``). The attach
stream stays open for output and to see the process end.

Only the first connection is accepted (the bootstrap's, made before any
handler code runs); the listener closes after it. Each directory has an
unguessable name under a base only Relay can list, and a container sees only
its own. Anything that stops the short way (an engine on another host, a
bootstrap that cannot connect) is said once in the log and the containers are
started without it from then on: requests go through the attach stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import structlog

log = structlog.get_logger(__name__)

MOUNT_TARGET: Final = "/run/relay-channel"
SOCKET_NAME: Final = "relay.sock"
# the variable that tells the bootstrap where to connect
ENV_NAME: Final = "RELAY_CHANNEL"
# the longest path a Unix socket can be bound to (sun_path, less its final NUL)
MAX_SOCKET_PATH: Final = 107
# The most the socket may hold unread. A bootstrap sends one short answer per
# request, read at once; more than this (with or without newlines) is not a
# bootstrap's: the link is broken and closed, and the container discarded.
MAX_PENDING_BYTES: Final = 1 << 16


def _nothing() -> None:
    return None


class DirectLink(asyncio.Protocol):
    """Relay's end of one container's socket: requests out, answers (Python's) in."""

    def __init__(self, made: Callable[[DirectLink], None]) -> None:
        self._made = made
        self.transport: Any = None
        self.buffer = bytearray()
        # how far ``buffer`` is known to hold no newline: each byte is searched once
        self._scanned = 0
        # the most bytes ever held unread (what the bound is checked against)
        self.peak = 0
        # why the link was closed for breaking the protocol ("" while it did not)
        self.broken = ""
        self.closed = False
        # set to the container's attach channel's ``wake``: one waiter for both ways
        self.wake: Callable[[], None] = _nothing

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._made(self)

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return  # closing: what was still in flight is dropped
        held = len(self.buffer) + len(data)
        if held > MAX_PENDING_BYTES:
            self.broken = (
                f"the socket carried more than {MAX_PENDING_BYTES} bytes that are not an answer"
            )
            self.buffer.clear()
            self._scanned = 0
            self.transport.close()
        else:
            self.buffer += data
            self.peak = max(self.peak, held)
        self.wake()

    def eof_received(self) -> bool:
        return False  # the bootstrap went away: close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.wake()

    def usable(self) -> bool:
        """Connected (asyncio makes the connection a moment after the accept)
        and not closing."""
        transport = self.transport
        return transport is not None and not self.closed and not transport.is_closing()

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def take_line(self) -> bytes | None:
        """The next complete line received, without its newline."""
        buffer = self.buffer
        end = buffer.find(b"\n", self._scanned)
        if end < 0:
            self._scanned = len(buffer)
            return None
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        self._scanned = 0
        return line

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.buffer.clear()  # nothing more is read from it
        self._scanned = 0


class DirectSocket:
    """One container's listening socket and its directory; the link once connected."""

    def __init__(self, directory: Path, owner: DirectSockets) -> None:
        self.directory = directory
        self.owner = owner
        self._server: asyncio.AbstractServer | None = None
        self.link: DirectLink | None = None
        self._wake: Callable[[], None] = _nothing

    def mount(self) -> dict[str, Any]:
        """The ``HostConfig.Mounts`` entry that shows the directory to the container."""
        return {
            "Type": "bind",
            "Source": str(self.directory),
            "Target": MOUNT_TARGET,
            "ReadOnly": True,
        }

    @staticmethod
    def env() -> str:
        return f"{ENV_NAME}={MOUNT_TARGET}/{SOCKET_NAME}"

    def notify(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` whenever the link receives or closes."""
        self._wake = wake
        if self.link is not None:
            self.link.wake = wake

    async def listen(self) -> None:
        path = self.directory / SOCKET_NAME
        loop = asyncio.get_running_loop()
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            self._server = await loop.create_unix_server(self._accept, str(path))
        else:  # a deep run directory: bind through a descriptor of the directory
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._server = await loop.create_unix_server(
                    self._accept, f"/proc/self/fd/{fd}/{SOCKET_NAME}"
                )
            finally:
                os.close(fd)
        os.chmod(path, 0o666)  # noqa: S103 - the container's user is not Relay's

    def _accept(self) -> DirectLink:
        return DirectLink(self._connected)

    def _connected(self, link: DirectLink) -> None:
        if self.link is not None:  # only the bootstrap's own, first connection
            link.close()
            return
        self.link = link
        link.wake = self._wake
        if self._server is not None:
            self._server.close()  # nobody else connects
            self._server = None
        self._wake()

    def close(self) -> None:
        """Close the link and the listener and remove the directory (idempotent)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.link is not None:
            self.link.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class DirectSockets:
    """Makes one :class:`DirectSocket` per container under ``base``, until turned off.

    ``base`` belongs to this worker (the process lock guarantees one worker per
    run directory): whatever an earlier, killed worker left there is removed."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.off_reason = ""
        self._prepared = False

    @property
    def on(self) -> bool:
        return not self.off_reason

    def turn_off(self, reason: str) -> None:
        """From now on containers start without a socket; said once in the log."""
        if self.off_reason:
            return
        self.off_reason = reason
        log.warning(
            "direct_socket_off", reason=reason, requests_go="through the engine's attach stream"
        )

    def _prepare(self) -> None:
        if self._prepared:
            return
        self._prepared = True
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.base)
        self.base.mkdir(mode=0o711, parents=True, exist_ok=True)
        # mkdir's mode is masked by the umask; others may only pass through
        os.chmod(self.base, 0o711)  # noqa: S103

    async def open(self) -> DirectSocket | None:
        """A new listening socket, or None when the short way is off or cannot be made."""
        if self.off_reason:
            return None
        direct = DirectSocket(self.base / secrets.token_hex(8), self)
        try:
            self._prepare()
            direct.directory.mkdir(mode=0o711)
            os.chmod(direct.directory, 0o711)  # noqa: S103 - the container's user passes
            await direct.listen()
        except OSError as exc:
            direct.close()
            self.turn_off(f"cannot listen in {self.base}: {exc.strerror or exc}")
            return None
        return direct
