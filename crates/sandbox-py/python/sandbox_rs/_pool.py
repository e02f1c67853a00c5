"""A warm pool of sandbox-rs sandboxes: the opt-in way to a create that does not wait for
the engine.

sandboxio has no pool: its ``create`` always makes a new sandbox, and its DSN takes no
parameter but ``timeout``. ``WarmPool`` keeps ``size`` sandboxes of one set of create
options ready (made in the background by sandbox-rs's own ``Pool``) and hands each out
once, never back. What it hands out is a sandbox like any other, with one difference a
caller must accept: its lifetime started when the pool made it, so it has between the
pool's minimum (a fifth of ``timeout``, at most 60 s) and ``timeout`` left, not all of it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import anyio

from sandboxio import _policy
from sandboxio.errors import ConfigurationError
from sandboxio.models import NetworkPolicy, Resources

from sandbox_rs import _errors
from sandbox_rs._backend import RustBackend, RustSandbox, _gpu_count
from sandbox_rs._errors import NativeError, map_error

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["WarmPool"]


class WarmPool:
    """``size`` never-used sandboxes of ``backend``, created with these options, kept ready.

    >>> async with WarmPool(DockerBackend(), size=4, template="sandbox-rs/python:3.11") as pool:  # doctest: +SKIP
    ...     sb = await pool.acquire()  # a ready spare at once, else a cold create
    ...     async with sb:
    ...         print((await sb.run(["echo", "hi"])).stdout)

    Filling starts at once. ``aclose`` (or leaving the ``async with``) kills every spare;
    so does the interpreter's exit for a pool never closed. Sandboxes already handed out
    are the caller's, as after ``create``.
    """

    def __init__(
        self,
        backend: RustBackend,
        *,
        size: int,
        template: str | None = None,
        resources: Resources = Resources(),
        network: NetworkPolicy = NetworkPolicy(),
        env: dict[str, str] | None = None,
        secrets: dict[str, str] | None = None,
        timeout: float = 300,
        metadata: dict[str, str] | None = None,
    ) -> None:
        if not isinstance(backend, RustBackend):
            raise ConfigurationError(
                f"WarmPool takes a sandbox-rs backend, not {type(backend).__name__}.",
                hint="Pass DockerBackend(), PodmanBackend() or FakeBackend() from sandbox_rs.",
            )
        native_backend = backend._open()  # pyright: ignore[reportPrivateUsage]
        _policy.validate_request(
            resources=resources,
            network=network,
            timeout=timeout,
            capabilities=backend.capabilities,
            backend=backend.name,
            allowlist_supported=backend.allowlist_supported,
        )
        try:
            self._native = native_backend.pool(
                size=int(size),
                template=template or backend.default_template,
                timeout=float(timeout),
                cpu=resources.cpu,
                memory_mb=resources.memory_mb,
                disk_mb=resources.disk_mb,
                gpu=_gpu_count(resources.gpu),
                egress=network.egress,
                allow=list(network.allow),
                ingress_ports=list(network.ingress_ports),
                env=dict(env or {}),
                secrets=dict(secrets or {}),
                metadata=dict(metadata or {}),
            )
        except NativeError as exc:
            raise map_error(exc, backend=backend.name, fallback=_errors.creation) from exc
        except OverflowError as exc:
            raise ConfigurationError(
                f"pool size {size} is out of range", hint="use a pool size from 1 to 256"
            ) from exc
        self._backend = backend
        self._metadata = dict(metadata or {})
        self._secrets = dict(secrets or {})
        self._env = dict(env or {})
        # At exit no event loop runs: the spares are killed blocking (GIL released).
        self._finalizer = weakref.finalize(self, self._native.shutdown_blocking)

    @property
    def ready(self) -> int:
        """Spares ready now."""
        return int(self._native.stats[0])

    @property
    def creating(self) -> int:
        """Spares being created."""
        return int(self._native.stats[1])

    @property
    def last_error(self) -> str | None:
        """Why the background refill last failed (cleared by a successful create), if it did."""
        return self._native.last_error  # type: ignore[no-any-return]

    async def wait_ready(self, n: int | None = None, *, timeout: float = 60) -> int:
        """Waits until ``n`` spares (default: the pool's size) are ready or ``timeout``
        seconds passed; returns the number ready."""
        return int(await self._native.wait_ready(n if n is not None else 1 << 16, float(timeout)))

    async def acquire(self) -> RustSandbox:
        """A never-used sandbox: a ready spare at once, else a cold create with the pool's
        options. Refused once the pool is closed."""
        if not self._finalizer.alive:
            raise ConfigurationError("this WarmPool is closed", hint="create a new WarmPool")
        try:
            handle = await self._native.acquire()
        except NativeError as exc:
            raise map_error(exc, backend=self._backend.name, fallback=_errors.creation) from exc
        return RustSandbox(
            self._backend, handle, metadata=self._metadata, secrets=self._secrets, env=self._env
        )

    async def aclose(self) -> None:
        """Stops refilling and kills every spare (idempotent). Shielded from cancellation
        and bounded (each kill by the teardown grace, ``SBX_TEARDOWN_GRACE``): a cancelled
        close must not leave spares running until their deadline."""
        if self._finalizer.detach() is not None:
            with anyio.CancelScope(shield=True):
                await self._native.shutdown()

    async def __aenter__(self) -> WarmPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
