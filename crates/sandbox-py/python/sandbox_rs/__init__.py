"""sandbox-rs for Python: its engines as sandboxio backends.

Installing the wheel registers three backends in sandboxio's ``sandboxio.backends``
entry-point group, so a DSN reaches them with nothing imported by hand::

    import sandboxio

    async with await sandboxio.create("rsdocker://sandbox-rs/python:3.11") as sb:
        print((await sb.run(["echo", "hi"])).stdout)

``rsdocker`` (Docker), ``rspodman`` (Podman) and ``rsfake`` (sandbox-rs's in-memory fake).
``WarmPool`` (opt-in, outside sandboxio's API) keeps sandboxes ready for an ``acquire``
that does not wait for the engine.
"""

from __future__ import annotations

import atexit

from sandbox_rs import _native

from sandbox_rs._backend import (
    DockerBackend,
    FakeBackend,
    PodmanBackend,
    RustBackend,
    RustFileSystem,
    RustProcess,
    RustSandbox,
    RustTerminal,
)
from sandbox_rs._credentials import Credential
from sandbox_rs._pool import WarmPool

# Results cross from tokio's worker threads to the event loop a moment after each Rust
# future ends; the interpreter must not finalize under one of those threads.
atexit.register(_native.quiesce, 2.0)

__all__ = [
    "Credential",
    "DockerBackend",
    "FakeBackend",
    "PodmanBackend",
    "RustBackend",
    "RustFileSystem",
    "RustProcess",
    "RustSandbox",
    "RustTerminal",
    "WarmPool",
]
