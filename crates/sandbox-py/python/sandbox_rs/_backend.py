"""The sandboxio backends over sandbox-rs: ``rsdocker``, ``rspodman`` and ``rsfake``.

Each conforms structurally to ``sandboxio.protocols`` (``ReapableBackend``,
``AsyncSandbox``, ``Process``, ``AsyncFileSystem``) and speaks sandboxio's value types,
exceptions and audit records. The work happens in Rust (``sandbox_rs._native``), on a
tokio runtime, without the GIL; this module only translates.

Cancellation stays cancellation: a cancelled ``run`` or stream kills its remote process
(shielded, bounded by ``SBX_TEARDOWN_GRACE``) and re-raises. ``__aexit__`` tears the
sandbox down shielded and bounded, warning with ``OrphanedSandboxWarning`` instead of
replacing the caller's exception.
"""

from __future__ import annotations

import os
from contextlib import suppress
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.lowlevel

from sandboxio import _policy
from sandboxio._record import OperationRecord, Redactor, operation
from sandboxio._teardown import shielded_kill, teardown_grace
from sandboxio.audit import AuditConfig
from sandboxio.errors import (
    CapabilityNotSupported,
    ConfigurationError,
    ConnectError,
    CreateTimeout,
    SandboxGone,
)
from sandboxio.models import (
    Capability,
    ExecResult,
    FileInfo,
    IsolationTier,
    ManagedSandbox,
    NetworkPolicy,
    OutputChunk,
    Resources,
    RichOutput,
)

from sandbox_rs import _errors, _native
from sandbox_rs._credentials import Credential
from sandbox_rs._errors import KILL_HINT, KILLED_EXIT, NativeError, map_error

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path
    from types import TracebackType

__all__ = [
    "DockerBackend",
    "FakeBackend",
    "PodmanBackend",
    "RustBackend",
    "RustFileSystem",
    "RustProcess",
    "RustSandbox",
    "RustTerminal",
]

# The capabilities sandboxio's conformance suite covers. A sandbox-rs capability outside
# this set (PTY, pause/resume, snapshots, lifetime extension …) is not declared to
# sandboxio: its rule is that what the suite cannot test stays behind `.native`.
_DECLARABLE = frozenset(
    {
        "RUN_COMMAND",
        "RUN_CODE",
        "STATEFUL_CODE",
        "STREAMING",
        "FILESYSTEM",
        "UPLOAD_DOWNLOAD",
        "NETWORK_POLICY",
        "GPU",
    }
)


def _capabilities(names: list[str]) -> Capability:
    caps = Capability(0)
    for name in names:
        if name in _DECLARABLE:
            caps |= Capability[name]
    return caps


def _gpu_count(gpu: str | None) -> int | None:
    if gpu is None:
        return None
    if gpu.isdigit() and int(gpu) > 0:
        return int(gpu)
    raise ConfigurationError(
        f"Resources.gpu={gpu!r}: sandbox-rs takes a number of GPUs, not a model name.",
        hint='Pass gpu="1" (a count); the engine\'s CDI devices decide the model.',
    )


class RustBackend:
    """A sandbox-rs engine as a sandboxio backend. Subclasses name the engine.

    ``endpoint`` is the engine's socket (``unix:///run/podman/podman.sock``); by default
    the engine is found as the Rust facade finds it (``DOCKER_HOST``, ``CONTAINER_HOST``,
    the standard sockets). Nothing connects before the first use.
    """

    engine: ClassVar[str]
    name: str

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        audit: AuditConfig | None = None,
        default_template: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.audit = audit or AuditConfig()
        self.default_template = default_template
        self._native: Any = None

    def _open(self) -> Any:
        """The native backend, opened on first use (blocking briefly, GIL released)."""
        if self._native is None:
            try:
                self._native = _native.open_backend(self.engine, self.endpoint)
            except NativeError as exc:
                raise map_error(exc, backend=self.name, fallback=_errors.creation) from exc
        return self._native

    @property
    def capabilities(self) -> Capability:
        return _capabilities(self._open().capabilities)

    @property
    def isolation(self) -> IsolationTier:
        return IsolationTier(self._open().isolation)

    @property
    def allowlist_supported(self) -> bool:
        """Whether ``NetworkPolicy(allow=...)`` is enforced (sandbox-rs's egress rules)."""
        return "EGRESS_ALLOWLIST" in self._open().capabilities

    def __repr__(self) -> str:
        where = f" at {self.endpoint}" if self.endpoint else ""
        return f"<{type(self).__name__} {self.name}{where}>"

    async def create(
        self,
        *,
        template: str | None = None,
        resources: Resources = Resources(),
        network: NetworkPolicy = NetworkPolicy(),
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        timeout: float = 300,
        metadata: dict[str, str] | None = None,
        max_lifetime: float | None = None,
        credentials: Sequence[Credential] = (),
    ) -> RustSandbox:
        """sandboxio's ``create``. sandbox-rs extras: ``max_lifetime`` (seconds from
        create) is how far ``native.extend`` may move the deadline (default: not at all);
        ``credentials`` are brokered (``sandbox_rs.Credential``): the sandbox's code sees
        only placeholders."""
        native = self._open()
        brokered = []
        for c in credentials:
            if not isinstance(c, Credential):
                raise ConfigurationError(
                    f"credentials holds a {type(c).__name__}, not a sandbox_rs.Credential.",
                    hint="Pass credentials=[Credential.bearer(\"API_KEY\", value, (\"api.example.com\",))].",
                )
            brokered.append(c._native())
        _policy.validate_request(
            resources=resources,
            network=network,
            timeout=timeout,
            capabilities=self.capabilities,
            backend=self.name,
            allowlist_supported=self.allowlist_supported,
        )
        gpu = _gpu_count(resources.gpu)
        try:
            # sandboxio's `timeout` bounds the create as well as the lifetime. A
            # cancelled create drops the Rust future, which removes what it had made.
            with anyio.fail_after(timeout):
                handle = await native.create(
                    template=template or self.default_template,
                    timeout=float(timeout),
                    cpu=resources.cpu,
                    memory_mb=resources.memory_mb,
                    disk_mb=resources.disk_mb,
                    gpu=gpu,
                    egress=network.egress,
                    allow=list(network.allow),
                    ingress_ports=list(network.ingress_ports),
                    env=dict(env or {}),
                    secrets=dict(secrets or {}),
                    metadata=dict(metadata or {}),
                    max_lifetime=max_lifetime,
                    credentials=brokered,
                )
        except TimeoutError as exc:
            raise CreateTimeout(
                f"creating a sandbox on {self.name} took longer than {timeout}s; "
                "nothing was left behind"
            ) from exc
        except NativeError as exc:
            raise map_error(exc, backend=self.name, fallback=_errors.creation) from exc
        # The records this sandbox writes in Python hide the brokered values as well.
        hidden = dict(secrets or {})
        hidden.update({f"credential:{c.env_var}": c.value for c in credentials})
        return RustSandbox(
            self, handle, metadata=dict(metadata or {}), secrets=hidden or None, env=env
        )

    async def connect(self, sandbox_id: str) -> RustSandbox:
        native = self._open()
        try:
            handle = await native.connect(sandbox_id)
        except NativeError as exc:
            raise map_error(
                exc,
                backend=self.name,
                fallback=lambda m, h: ConnectError(m, hint=h or None),
            ) from exc
        return RustSandbox(self, handle, metadata={}, secrets=None, env=None)

    async def list_managed(
        self, *, labels: Mapping[str, str] | None = None
    ) -> list[ManagedSandbox]:
        """Every sandbox sandbox-rs labelled on this engine, stopped ones included."""
        native = self._open()
        try:
            listed = await native.list_managed(dict(labels or {}))
        except NativeError as exc:
            raise ConnectError(
                f"{self.name} could not list sandboxes",
                hint="Inspect `__cause__` for the engine's reason.",
            ) from exc
        return [
            ManagedSandbox(
                sandbox_id=sid,
                backend=self.name,
                state=state,
                created_at=None if created is None else datetime.fromtimestamp(created, timezone.utc),
                labels=dict(meta),
            )
            for sid, state, created, meta in listed
        ]

    async def kill_managed(self, sandbox_id: str) -> bool:
        """Removes one sandbox by id; False if it was already gone."""
        native = self._open()
        try:
            return bool(await native.kill_managed(sandbox_id))
        except NativeError as exc:
            if getattr(exc, "code", None) == "SBX_E1204":
                return False
            raise ConnectError(
                f"{self.name} could not kill sandbox {sandbox_id!r}", hint=KILL_HINT
            ) from exc


class DockerBackend(RustBackend):
    """sandbox-rs on Docker (``rsdocker://<image>``)."""

    engine = "docker"
    name = "rsdocker"


class PodmanBackend(RustBackend):
    """sandbox-rs on Podman (``rspodman://<image>``)."""

    engine = "podman"
    name = "rspodman"


class FakeBackend(RustBackend):
    """sandbox-rs's in-memory fake (``rsfake://``): no engine, for tests."""

    engine = "fake"
    name = "rsfake"


def _check_terminal_size(rows: int, cols: int) -> None:
    """A terminal's size fits the Rust side's 16 bits and is not empty."""
    if not (0 < rows < 65536 and 0 < cols < 65536):
        raise ConfigurationError(
            f"terminal size {rows}x{cols} is empty or too large.",
            hint="Pass rows and cols between 1 and 65535, e.g. rows=24, cols=80.",
        )


def _argv(cmd: str | list[str]) -> list[str]:
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


class RustSandbox:
    """A live sandbox-rs sandbox. ``native`` is the ``sandbox_rs._native.NativeSandbox``."""

    def __init__(
        self,
        backend: RustBackend,
        handle: Any,
        *,
        metadata: Mapping[str, str],
        secrets: Mapping[str, str] | None,
        env: Mapping[str, str] | None,
    ) -> None:
        self._backend = backend
        self._handle = handle
        self.id: str = handle.id
        self.capabilities: Capability = _capabilities(handle.capabilities)
        self.isolation: IsolationTier = IsolationTier(handle.isolation)
        self.labels: dict[str, str] = dict(metadata)
        self._redact = Redactor(secrets, env)
        self._killed = False
        self._fs = RustFileSystem(self)

    def __repr__(self) -> str:
        state = "killed" if self._killed else "running"
        caps = "|".join(c.name or "" for c in Capability if c in self.capabilities)
        return (
            f"<RustSandbox {self._backend.name}:{self.id} {self.isolation.value} "
            f"{state} caps={caps}>"
        )

    # --- plumbing ---------------------------------------------------------------------------

    def _need(self, cap: Capability) -> None:
        if cap not in self.capabilities:
            raise CapabilityNotSupported(cap, backend=self._backend.name)

    def _gone(self) -> SandboxGone:
        return SandboxGone(f"sandbox {self.id} no longer exists on {self._backend.name}")

    def _record(self, event: str, **fields: Any) -> OperationRecord:
        return OperationRecord(
            event=event,
            sandbox_id=self.id,
            backend=self._backend.name,
            isolation=self.isolation,
            metadata=self.labels,
            **fields,
        )

    def _op(self, record: OperationRecord) -> Any:
        return operation(record, config=self._backend.audit, redact=self._redact)

    def _map(self, exc: BaseException, fallback: Any = _errors.execution, **kw: Any) -> Exception:
        return map_error(exc, backend=self._backend.name, fallback=fallback, **kw)

    def _spawn(
        self,
        cmd: str | list[str],
        env: Mapping[str, str] | None,
        timeout: float | None,
        pty: tuple[int, int] | None = None,
    ) -> Any:
        if self._killed:
            raise self._gone()
        try:
            if isinstance(cmd, str):
                return self._handle.spawn(shell=cmd, env=dict(env or {}), timeout=timeout, pty=pty)
            return self._handle.spawn(argv=list(cmd), env=dict(env or {}), timeout=timeout, pty=pty)
        except NativeError as exc:
            raise self._map(exc) from exc

    @staticmethod
    async def _kill_process(proc: Any) -> None:
        """Kills a remote process where cancellation cannot reach, bounded by the grace."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(teardown_grace()):
            with suppress(Exception):
                await proc.kill()

    # --- AsyncSandbox protocol --------------------------------------------------------------

    async def run(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        self._need(Capability.RUN_COMMAND)
        _policy.validate_timeout(timeout)
        record = self._record("exec", argv=_argv(cmd))
        async with self._op(record):
            proc = self._spawn(cmd, env, timeout)
            try:
                code, out, err = await proc.collect()
            except anyio.get_cancelled_exc_class():
                await self._kill_process(proc)
                raise
            except NativeError as exc:
                raise self._map(exc) from exc
            record.exit_code = code
            record.bytes_out = len(out) + len(err)
        return ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"))

    async def run_code(
        self,
        code: str,
        *,
        language: str = "python",
        context_id: str | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        self._need(Capability.RUN_CODE)
        if context_id is not None:
            self._need(Capability.STATEFUL_CODE)
        _policy.validate_timeout(timeout)
        if self._killed:
            raise self._gone()
        record = self._record("run_code", code=code)
        async with self._op(record):
            try:
                # A cancelled call drops the Rust future, whose process guard kills the
                # interpreter's process tree (bounded, in the background).
                exit_code, out, err, rich = await self._handle.run_code(
                    code, language=language, context_id=context_id, timeout=timeout
                )
            except NativeError as exc:
                raise self._map(exc) from exc
            record.exit_code = exit_code
            record.bytes_in = len(code)
            record.bytes_out = len(out) + len(err)
        results = (
            tuple(RichOutput(mime, _rich_text(mime, data)) for mime, data in rich) if rich else None
        )
        return ExecResult(
            exit_code, out.decode(errors="replace"), err.decode(errors="replace"), results=results
        )

    def stream(
        self,
        cmd: str | list[str],
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> RustProcess:
        self._need(Capability.STREAMING)
        _policy.validate_timeout(timeout)
        if self._killed:
            raise self._gone()
        return RustProcess(self, cmd, env, timeout)

    def terminal(
        self,
        cmd: str | list[str],
        *,
        rows: int = 24,
        cols: int = 80,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> RustTerminal:
        """A streamed execution with a pseudo-terminal (a sandbox-rs extra, Rust
        ``RunOptions::pty``; sandboxio has no terminal): the program sees a terminal on
        stdin, stdout and stderr (both arrive merged as stdout), and the
        ``RustTerminal`` takes keystrokes (``write``), end of input (``end``) and window
        sizes (``resize``) while its output is read. A backend without ``PTY`` (the
        fake) refuses it with ``CapabilityNotSupported`` when entered."""
        _policy.validate_timeout(timeout)
        _check_terminal_size(rows, cols)
        if self._killed:
            raise self._gone()
        return RustTerminal(self, cmd, env, timeout, (rows, cols))

    async def kill(self) -> None:
        if self._killed:
            await anyio.lowlevel.checkpoint()
            return
        try:
            await self._handle.kill()
        except NativeError as exc:
            if getattr(exc, "code", None) != "SBX_E1204":
                raise self._map(exc, fallback=_errors.teardown) from exc
        self._killed = True

    @property
    def files(self) -> RustFileSystem:
        self._need(Capability.FILESYSTEM)
        return self._fs

    @property
    def native(self) -> Any:
        return self._handle

    async def __aenter__(self) -> RustSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await shielded_kill(
            self.kill, sandbox_id=self.id, backend=self._backend.name, labels=self.labels
        )


def _rich_text(mime: str, data: bytes) -> str:
    """RichOutput carries text: text types as they are, binary ones base64-encoded."""
    if mime.startswith("text/") or mime.endswith("json") or mime.endswith("+xml"):
        return data.decode(errors="replace")
    import base64

    return base64.b64encode(data).decode()


class RustProcess:
    """A streamed execution. Entering starts it; exiting kills it if it still runs."""

    def __init__(
        self,
        sb: RustSandbox,
        cmd: str | list[str],
        env: Mapping[str, str] | None,
        timeout: float | None,
    ) -> None:
        self._sb = sb
        self._cmd = cmd
        self._env = env
        self._timeout = timeout
        self._proc: Any = None
        self._exit: int | None = None
        self._record: OperationRecord | None = None
        self._pty: tuple[int, int] | None = None

    @property
    def returncode(self) -> int | None:
        return self._exit

    async def __aenter__(self) -> RustProcess:
        self._proc = self._sb._spawn(self._cmd, self._env, self._timeout, self._pty)  # pyright: ignore[reportPrivateUsage]
        self._record = self._sb._record("exec", argv=_argv(self._cmd))  # pyright: ignore[reportPrivateUsage]
        try:
            await self._proc.start()
        except anyio.get_cancelled_exc_class():
            await self._sb._kill_process(self._proc)  # pyright: ignore[reportPrivateUsage]
            self._exit = KILLED_EXIT
            raise
        except NativeError as exc:
            self._exit = KILLED_EXIT
            raise self._sb._map(exc) from exc  # pyright: ignore[reportPrivateUsage]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._exit is None:
            await shielded_kill(
                self.kill,
                sandbox_id=self._sb.id,
                backend=self._sb._backend.name,  # pyright: ignore[reportPrivateUsage]
                labels=self._sb.labels,
            )
        if self._record is not None:
            record, self._record = self._record, None
            record.exit_code = self._exit
            async with self._sb._op(record):  # pyright: ignore[reportPrivateUsage]
                pass

    def __aiter__(self) -> RustProcess:
        return self

    async def __anext__(self) -> OutputChunk:
        if self._proc is None:
            raise RuntimeError("enter the context first: `async with sb.stream(...)`")
        if self._exit is not None:
            raise StopAsyncIteration
        try:
            item = await self._proc.next()
            if item is None:
                self._exit = int(await self._proc.wait())
                raise StopAsyncIteration
        except anyio.get_cancelled_exc_class():
            await self._sb._kill_process(self._proc)  # pyright: ignore[reportPrivateUsage]
            self._exit = KILLED_EXIT
            raise
        except NativeError as exc:
            # The Rust process killed its tree before reporting a timeout or failure.
            self._exit = KILLED_EXIT
            raise self._sb._map(exc) from exc  # pyright: ignore[reportPrivateUsage]
        stream, data = item
        return OutputChunk(stream, data)

    async def wait(self) -> ExecResult:
        async for _ in self:  # unconsumed output is drained and discarded
            pass
        assert self._exit is not None
        return ExecResult(self._exit, "", "", streamed=True)

    async def kill(self) -> None:
        if self._exit is None:
            self._exit = KILLED_EXIT
            if self._proc is not None:
                try:
                    await self._proc.kill()
                except NativeError as exc:
                    raise self._sb._map(exc, fallback=_errors.teardown) from exc  # pyright: ignore[reportPrivateUsage]
        await anyio.lowlevel.checkpoint()


class RustTerminal(RustProcess):
    """A streamed execution with a pseudo-terminal (``RustSandbox.terminal``). Entering
    starts it and takes its input; iterating yields its output (stdout: the terminal
    merges both streams, lines end in ``\r\n``); exiting kills it if it still runs."""

    def __init__(
        self,
        sb: RustSandbox,
        cmd: str | list[str],
        env: Mapping[str, str] | None,
        timeout: float | None,
        size: tuple[int, int],
    ) -> None:
        super().__init__(sb, cmd, env, timeout)
        self._pty = size
        self._input: Any = None

    async def __aenter__(self) -> RustTerminal:
        await super().__aenter__()
        try:
            self._input = await self._proc.input()
        except BaseException:
            await self._sb._kill_process(self._proc)  # pyright: ignore[reportPrivateUsage]
            self._exit = KILLED_EXIT
            raise
        return self

    async def _send(self, call: Any) -> None:
        if self._input is None:
            raise RuntimeError("enter the context first: `async with sb.terminal(...)`")
        try:
            await call(self._input)
        except NativeError as exc:
            raise self._sb._map(exc) from exc  # pyright: ignore[reportPrivateUsage]

    async def write(self, data: bytes | str) -> None:
        """Sends ``data`` as a keyboard does (``"\r"`` is Enter, ``"\x03"`` Ctrl-C)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._send(lambda i: i.write(raw))

    async def end(self) -> None:
        """Ends the input: end-of-file (``^D``), which a program reading lines takes as
        the end."""
        await self._send(lambda i: i.end())

    async def resize(self, rows: int, cols: int) -> None:
        """Sets the window size; the program gets ``SIGWINCH``. ``ConfigurationError``
        for an empty size."""
        _check_terminal_size(rows, cols)
        await self._send(lambda i: i.resize(rows, cols))


class RustFileSystem:
    """The sandbox's files; paths are sandbox paths (relative ones under ``/work``)."""

    def __init__(self, sb: RustSandbox) -> None:
        self._sb = sb

    async def _call(self, event: str, path: str, fn: Any, *args: Any) -> Any:
        sb = self._sb
        if sb._killed:  # pyright: ignore[reportPrivateUsage]
            raise sb._gone()  # pyright: ignore[reportPrivateUsage]
        record = sb._record(event, argv=[path])  # pyright: ignore[reportPrivateUsage]
        async with sb._op(record):  # pyright: ignore[reportPrivateUsage]
            try:
                result = await fn(*args)
            except NativeError as exc:
                raise sb._map(exc, fallback=_errors.filesystem, path=path) from exc  # pyright: ignore[reportPrivateUsage]
            record.exit_code = 0
            if isinstance(result, bytes):
                record.bytes_out = len(result)
        return result

    async def read(self, path: str) -> bytes:
        return await self._call("file_read", path, self._sb.native.read, path)  # type: ignore[no-any-return]

    async def write(self, path: str, data: bytes | str) -> None:
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await self._call("file_write", path, self._sb.native.write, path, payload)

    async def upload(self, local: str | Path, remote: str) -> None:
        self._sb._need(Capability.UPLOAD_DOWNLOAD)  # pyright: ignore[reportPrivateUsage]
        await self._call("file_upload", remote, self._sb.native.upload, os.fspath(local), remote)

    async def download(self, remote: str, local: str | Path) -> None:
        self._sb._need(Capability.UPLOAD_DOWNLOAD)  # pyright: ignore[reportPrivateUsage]
        await self._call("file_download", remote, self._sb.native.download, remote, os.fspath(local))

    async def ls(self, path: str = ".") -> list[FileInfo]:
        listed = await self._call("file_ls", path, self._sb.native.ls, path)
        return sorted(
            (FileInfo(p, int(size), bool(is_dir)) for p, size, is_dir in listed),
            key=lambda e: e.path,
        )

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        await self._call("file_mkdir", path, self._sb.native.mkdir, path, parents)

    async def remove(self, path: str) -> None:
        await self._call("file_remove", path, self._sb.native.remove, path)

