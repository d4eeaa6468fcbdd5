"""One hardened execution container and the request/answer protocol with it.

The container runs the runtime's bootstrap as a long-lived process. Relay is
attached to its stdin (requests) and its multiplexed stdout/stderr: the
handler's output and, after it, the one answer frame come on stderr; anything
on stdout is output (see ``relay.adapters.docker.bootstraps`` for the protocol).
When Relay's own socket is mounted into the container (``direct``), requests go
there instead, and a Python bootstrap answers there, saying how many bytes of
stderr output came first; the answer is returned once that much has arrived.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiodocker
import anyio
import msgspec
import structlog

from relay.adapters.docker.attach import AttachChannel, take_over
from relay.adapters.docker.bootstraps import (
    END_MARKER_PREFIX,
    bootstrap_command,
)
from relay.adapters.docker.direct import DirectLink, DirectSocket, DirectSockets
from relay.adapters.docker.lines import LineBuffer, ProtocolError, StderrReader
from relay.domain.execution import CapturedOutput, InvocationRequest
from relay.domain.handler_context import invocation_env

log = structlog.get_logger(__name__)

EXECUTION_TYPE: Final = "execution"
USER: Final = "10001:10001"
MEMORY_BYTES: Final = 128 * 1024 * 1024
NANO_CPUS: Final = 1_000_000_000
PIDS_LIMIT: Final = 128
TMPFS_OPTIONS: Final = "rw,nosuid,nodev,size=64m,mode=1777"
# The container's own margin past a request's timeout (and past Relay's idle
# eviction) before it exits by itself.
GRACE_S: Final = 2.0
CLEANUP_BUDGET_S: Final = 15.0
PER_INVOCATION_LABELS: Final = (
    "relay.handler",
    "relay.message_id",
    "relay.event_id",
    "relay.event_name",
)


class ProcessExited(Exception):
    """The container's process ended (its streams closed) mid-conversation."""


@dataclass(frozen=True)
class ContainerSpec:
    """Everything that decides how an execution container is created."""

    function: str
    image: str
    runtime: str
    hostname: str
    networks: Sequence[str] = ()
    idle_deadline_s: float = 300.0 + GRACE_S


def labels_for(spec: ContainerSpec) -> dict[str, str]:
    labels = {
        "relay.type": EXECUTION_TYPE,
        "relay.function": spec.function,
        "relay.hostname": spec.hostname,
        "relay.image": spec.image,
        "relay.runtime": spec.runtime,
    }
    # A reused container outlives single invocations: these stay empty.
    labels.update(dict.fromkeys(PER_INVOCATION_LABELS, ""))
    return labels


def hardened_host_config() -> dict[str, Any]:
    """The hardening every container Relay runs gets, execution and service alike:
    read-only root with a bounded ``/tmp``, no capabilities, no new privileges,
    memory/CPU/pids limits, and a tiny init as PID 1 (it reaps subprocesses and
    lets the bootstrap's watchdog kill the bootstrap: PID 1 ignores SIGKILL)."""
    return {
        "ReadonlyRootfs": True,
        "Tmpfs": {"/tmp": TMPFS_OPTIONS},  # noqa: S108 - the container's own /tmp
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges"],
        "Memory": MEMORY_BYTES,
        "MemorySwap": MEMORY_BYTES,
        "NanoCpus": NANO_CPUS,
        "PidsLimit": PIDS_LIMIT,
        "Init": True,
    }


def container_config(spec: ContainerSpec, direct: DirectSocket | None = None) -> dict[str, Any]:
    """The hardened create body for the Engine API (``POST /containers/create``);
    ``direct``'s directory is mounted read-only when given."""
    config: dict[str, Any] = {
        "Image": spec.image,
        "Cmd": bootstrap_command(spec.runtime),
        "Env": [
            f"RELAY_FUNCTION={spec.function}",
            f"RELAY_IDLE_DEADLINE_S={spec.idle_deadline_s:g}",
            f"RELAY_GRACE_S={GRACE_S:g}",
            "PYTHONDONTWRITEBYTECODE=1",
            "HOME=/tmp",
        ],
        "User": USER,
        "Tty": False,
        "OpenStdin": True,
        # stdin closes when Relay's attachment goes away: an orphan sees EOF.
        "StdinOnce": True,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Labels": labels_for(spec),
        "HostConfig": {"AutoRemove": True, **hardened_host_config()},
    }
    if direct is not None:
        config["Env"].append(direct.env())
        config["HostConfig"]["Mounts"] = [direct.mount()]
    if spec.networks:
        # API 1.41 accepts one endpoint at create; the others are connected
        # before start (see ``start_container``).
        first = spec.networks[0]
        config["HostConfig"]["NetworkMode"] = first
        config["NetworkingConfig"] = {"EndpointsConfig": {first: {}}}
    return config


def _line_text(raw: bytes) -> str:
    return raw.rstrip(b"\r").decode("utf-8", errors="replace")


@dataclass(eq=False)
class ExecutionContainer:
    """A started container with Relay attached; serves one request at a time.

    ``stream`` is aiodocker's attach stream (it opened the connection and
    closes it); ``channel`` reads and writes that connection on the warm path."""

    spec: ContainerSpec
    container: Any  # aiodocker DockerContainer
    stream: Any  # aiodocker Stream (attach)
    channel: AttachChannel
    # Relay's socket in the container; its link is None until the bootstrap connects
    direct: DirectSocket | None = None
    created_at: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    invocations: int = 0
    # the stdout stream (output only) and the stderr stream (output, then answers)
    _stray: LineBuffer = field(default_factory=LineBuffer)
    _stderr: StderrReader = field(default_factory=StderrReader)
    # bytes received on the stderr stream so far (answers on the socket count theirs)
    _err_bytes: int = 0
    _request: InvocationRequest | None = None
    _prefix: str = ""
    _output: Callable[[str], None] | None = None
    _capture: CapturedOutput | None = None

    @property
    def id(self) -> str:
        return str(self.container.id)

    @property
    def image(self) -> str:
        return self.spec.image

    async def call(
        self,
        request: InvocationRequest,
        timeout_s: float,
        output: Callable[[str], None],
        capture: CapturedOutput | None = None,
    ) -> Answer:
        """Send one request and read until its answer, which comes after all its output.

        Raises ``DeadlinePassed`` when no answer came within ``timeout_s``,
        ``ProcessExited`` when the process ends first and ``ProtocolError`` on
        an invalid answer.
        """
        self.invocations += 1
        self._request, self._prefix = request, ""  # the prefix is made on first use
        nonce = _nonces.next()
        env = dict(request.env)
        # per invocation, so in the request (the container is reused): the
        # deadline counts from now, just before the request leaves
        env.update(
            invocation_env(request.handler, request.handler_context, time.time() + timeout_s)
        )
        frame = {
            "id": nonce,
            "handler": request.handler,
            "env": env,
            "event": request.event.decode("utf-8", errors="replace"),
            "timeout_s": timeout_s,
        }
        if request.capture_output:  # the return value too (delivery never asks)
            frame["want_result"] = True
        channel = self.channel
        request_bytes = msgspec.json.encode(frame) + b"\n"
        link = self._link()
        try:
            (link or channel).write(request_bytes)
        except (OSError, RuntimeError) as exc:
            raise ProcessExited(str(exc)) from exc
        marker = END_MARKER_PREFIX + nonce.encode()
        self._output = output
        self._capture = capture
        stderr = self._stderr
        stderr.begin(marker, self._line)  # what came after the previous answer
        # an answer from the socket, held until the output it counts has arrived
        pending: Answer | None = None
        channel.arm(timeout_s)
        try:
            while True:
                received = channel.next_frame()
                if received is not None:
                    if received[0] == 1:
                        # the stdout stream carries no protocol: a stray write to fd 1
                        self._stray.feed(received[1], self._stray_line)
                        continue
                    self._err_bytes += len(received[1])
                    answer = stderr.take(received[1], marker, self._line)
                    if answer is not None:
                        return self._result(_parse_answer(answer))
                    continue
                if pending is None and (link := link or self._link()) is not None:
                    line = link.take_line()
                    if line is not None:
                        pending = self._answer_on_socket(line, marker)
                    elif link.broken:
                        raise ProtocolError(link.broken)
                if pending is not None and (self._err_bytes >= pending.out or channel.closed):
                    self._flush_partial()  # a last unfinished line is this request's
                    return self._result(pending)
                if channel.closed:  # cleanly or not: the runtime asks the engine why
                    self._flush_partial()
                    raise ProcessExited("the container's process ended")
                # (a closed socket alone waits for the attach stream's end: the
                # output written before the process ended comes first)
                await channel.wait()
        finally:
            channel.disarm()

    def _link(self) -> DirectLink | None:
        """The socket's connection, when the bootstrap has connected and it is open."""
        link = self.direct.link if self.direct is not None else None
        return link if link is not None and link.usable() else None

    def _answer_on_socket(self, line: bytes, marker: bytes) -> Answer:
        if not line.startswith(marker):
            raise ProtocolError("the socket carried something that is not this request's answer")
        answer = _parse_answer(line[len(marker) :])
        if answer.out < 0:
            raise ProtocolError("the answer on the socket does not count its output")
        return answer

    def _result(self, answer: Answer) -> Answer:
        if answer.channel and self.direct is not None:
            # the bootstrap could not reach the socket; it is served through stdin
            self.direct.owner.turn_off(f"the bootstrap in {self.image}: {answer.channel}")
        return answer

    def _line_prefix(self) -> str:
        if not self._prefix:
            self._prefix = _prefix(self._request, function=self.spec.function)
        return self._prefix

    def _line(self, raw: bytes) -> None:
        """Forward one output line of the current request's."""
        assert self._output is not None
        text = _line_text(raw)
        self._output(self._line_prefix() + text)
        if self._capture is not None:
            self._capture.add(text)

    def _stray_line(self, raw: bytes) -> None:
        if raw.strip():
            self._line(raw)

    def _flush_partial(self) -> None:
        self._stray.end(self._stray_line)
        self._stderr.end(self._line)

    def buffered(self) -> int:
        """Bytes Relay holds for this container: the attach stream's unread
        bytes, the socket's, and the unfinished output lines."""
        link = self.direct.link if self.direct is not None else None
        return (
            self.channel.buffered
            + (len(link.buffer) if link is not None else 0)
            + self._stray.held
            + self._stderr.held
        )

    def exited(self) -> bool:
        """True once the attachment saw end-of-stream (the process is gone), or
        the socket broke the protocol (then Relay closed it: the process leaves)."""
        return self.channel.closed or self.link_broken()

    def link_broken(self) -> bool:
        """The socket carried more than an answer (a handler wrote into it)."""
        link = self.direct.link if self.direct is not None else None
        return link is not None and bool(link.broken)

    async def exit_code(self) -> int | None:
        """The exit code if the engine still knows the container."""
        with contextlib.suppress(aiodocker.DockerError, OSError, TimeoutError), anyio.fail_after(2):
            info = await self.container.show()
            state = info.get("State", {})
            if not state.get("Running", False):
                return int(state.get("ExitCode", 0))
        return None

    async def destroy(self) -> None:
        """Idempotent backstop removal: gone or already being removed is success."""
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(Exception):
                await self.stream.close()
            if self.direct is not None:
                self.direct.close()
            await remove_container(self.container)


async def remove_container(container: Any) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_BUDGET_S):
        try:
            await container.delete(force=True)
        except aiodocker.DockerError as exc:
            if exc.status not in (404, 409):
                log.warning("container_remove_failed", container=container.id, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a failed backstop must never stop the worker
            log.warning("container_remove_failed", container=container.id, error=repr(exc))


class Answer(msgspec.Struct):
    """The bootstrap's answer to one request (see ``bootstraps/__init__.py``)."""

    ok: bool
    error: str
    # the return value's JSON text, bounded by the bootstrap; its full size when cut
    result: str | None = None
    result_size: int = 0
    # set in the first answer of a bootstrap that was offered a socket and could
    # not connect: why
    channel: str = ""
    # on the socket: how many bytes the bootstrap had written to stderr by then
    out: int = -1


_ANSWER = msgspec.json.Decoder(Answer)


def _parse_answer(raw: bytes) -> Answer:
    try:
        return _ANSWER.decode(raw)
    except msgspec.ValidationError as exc:
        raise ProtocolError("the answer frame is malformed") from exc
    except msgspec.DecodeError as exc:
        raise ProtocolError("the answer frame is not JSON") from exc


class _Nonces:
    """Unguessable request ids, hex, drawn from the OS in batches (one
    ``getrandom`` call per 256 requests instead of one per request)."""

    SIZE: Final = 12
    BATCH: Final = 256

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> str:
        if self._at >= len(self._pool):
            self._pool, self._at = secrets.token_bytes(self.SIZE * self.BATCH), 0
        at = self._at
        self._at = at + self.SIZE
        return self._pool[at : at + self.SIZE].hex()


_nonces = _Nonces()


def _prefix(request: InvocationRequest | None, *, function: str = "") -> str:
    if request is None:
        return f'relay: function "{function}": '
    prefix = f'relay: function "{request.function}" handler "{request.handler}"'
    if request.context:
        prefix += f' message "{request.context}"'
    return prefix + ": "


async def start_container(
    docker: aiodocker.Docker, spec: ContainerSpec, sockets: DirectSockets | None = None
) -> ExecutionContainer:
    """Create, attach and start one hardened execution container, with a socket
    from ``sockets`` when given (every runtime's bootstrap connects to one).

    On any failure the half-made container (and its socket) is removed before
    the error propagates.
    """
    direct = None
    if sockets is not None:
        direct = await sockets.open()
    try:
        container, mounted = await _create(docker, spec, direct)
    except BaseException:
        if direct is not None:
            direct.close()
        raise
    if direct is not None and not mounted:
        direct.close()
        direct = None
    try:
        for network in spec.networks[1:]:
            await (await docker.networks.get(network)).connect({"Container": container.id})
        stream = container.attach(stdin=True, stdout=True, stderr=True)
        await stream._init()  # attach before start, so no output is missed
        channel = take_over(stream)
        if direct is not None:
            direct.notify(channel.wake)
        try:
            await container.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await stream.close()
            raise
    except BaseException:
        if direct is not None:
            direct.close()
        await remove_container(container)
        raise
    return ExecutionContainer(
        spec=spec, container=container, stream=stream, channel=channel, direct=direct
    )


async def _create(
    docker: aiodocker.Docker, spec: ContainerSpec, direct: DirectSocket | None
) -> tuple[Any, bool]:
    """The created container, and whether ``direct`` is mounted in it.

    An engine that refuses the mount (it runs on another host, where the
    directory does not exist) gets the container without it, and the sockets
    are turned off for good."""
    if direct is None:
        return await docker.containers.create(config=container_config(spec)), False
    try:
        return await docker.containers.create(config=container_config(spec, direct)), True
    except aiodocker.DockerError as exc:
        if exc.status != 400:
            raise
        container = await docker.containers.create(config=container_config(spec))
        direct.owner.turn_off(f"the engine cannot mount {direct.directory}: {exc.message}")
        return container, False


def env_names(env: Mapping[str, str]) -> list[str]:
    """Variable names only, for logs: values (secrets) never leave the request."""
    return sorted(env)
