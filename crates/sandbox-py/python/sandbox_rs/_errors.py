"""sandbox-rs errors as sandboxio's exception classes.

Every native ``SandboxError`` (``sandbox_rs._native.SandboxError``: ``code``, ``message``,
``hint``) becomes the sandboxio class for its code, raised ``from`` the native one so it
stays the ``__cause__``. The codes are the same catalogue (``SBX_E1204`` is ``SandboxGone``
on both sides); where sandboxio has no class for a sandbox-rs code, the operation's own
fallback class is used with the native message and hint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandboxio.errors import (
    AuditSinkError,
    AuthError,
    CapabilityNotSupported,
    ConfigurationError,
    ConnectError,
    CreateTimeout,
    CreationError,
    ExecutionError,
    ExecutionTimeout,
    FileSystemError,
    NetworkPolicyViolation,
    PathNotFound,
    RateLimitError,
    ResourceLimitExceeded,
    SandboxError,
    SandboxGone,
)
from sandboxio.models import Capability, ExecResult

from sandbox_rs import _native

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["KILL_HINT", "KILLED_EXIT", "NativeError", "map_error"]

NativeError = _native.SandboxError

# 128 + SIGKILL, what a killed process reports (the Rust side's KILLED_EXIT_CODE).
KILLED_EXIT = 137

KILL_HINT = (
    "The sandbox may still be running; `sandboxio reap --kill` (or the sandbox-rs CLI's "
    "`sandbox reap --kill`) removes it."
)

# sandbox-rs capabilities sandboxio has no flag for, and the flag that covers them.
_CAPABILITY_ALIASES = {
    "EGRESS_ALLOWLIST": "NETWORK_POLICY",
    "INGRESS_PORTS": "NETWORK_POLICY",
    "STDIN": "STREAMING",
}


def _capability(names: str | None) -> Capability | None:
    for name in (names or "").split("|"):
        name = _CAPABILITY_ALIASES.get(name.strip(), name.strip())
        if name in Capability.__members__:
            return Capability[name]
    return None


def map_error(
    exc: BaseException,
    *,
    backend: str,
    fallback: Callable[[str, str], SandboxError],
    path: str | None = None,
) -> SandboxError:
    """The sandboxio exception for a native error; raise it ``from exc``.

    ``fallback(message, hint)`` builds the class for codes that mean "the operation
    failed" in the caller's terms (``CreationError`` for create, ``ConnectError`` for a
    kill, ``ExecutionError`` for a run, ``FileSystemError`` for files).
    """
    code = getattr(exc, "code", None)
    message = str(getattr(exc, "message", exc))
    hint = str(getattr(exc, "hint", "") or "")
    if code == "SBX_E1000" or code == "SBX_E1303":
        return ConfigurationError(message, hint=hint or None)
    if code == "SBX_E1101":
        cap = _capability(getattr(exc, "capability", None))
        if cap is None:
            return ConfigurationError(message, hint=hint or None)
        return CapabilityNotSupported(cap, backend=backend)
    if code == "SBX_E1202":
        return ConnectError(message, hint=hint or None)
    if code == "SBX_E1203":
        return CreateTimeout(message, hint=hint or None)
    if code == "SBX_E1204":
        return SandboxGone(message)
    if code == "SBX_E1302":
        return ExecutionTimeout(message)
    if code == "SBX_E1401":
        return NetworkPolicyViolation(message, hint=hint or None)
    if code == "SBX_E1402":
        err = ResourceLimitExceeded(message, value="reached")
        if hint:
            err.hint = hint
        return err
    if code == "SBX_E1501":
        env_var = str(getattr(exc, "env_var", None) or "the provider's credential variable")
        err = AuthError(backend, env_var=env_var)
        if env_var in hint:
            err.hint = hint
        return err
    if code == "SBX_E1502":
        return RateLimitError(message, hint=hint or None)
    if code == "SBX_E1601":
        return AuditSinkError(message, hint=hint or None)
    if code == "SBX_E1701":
        return PathNotFound(path if path is not None else message)
    if code in ("SBX_E1700", "SBX_E1702", "SBX_E1703"):
        return FileSystemError(message, hint=hint or None)
    return fallback(message, hint)


def creation(message: str, hint: str) -> SandboxError:
    return CreationError(message, hint=hint or None)


def teardown(message: str, hint: str) -> SandboxError:
    # A kill that fails is a management failure with the operator's fix, never an
    # execution failure: nothing executed.
    return ConnectError(message, hint=KILL_HINT)


def execution(message: str, hint: str) -> SandboxError:
    return ExecutionError(ExecResult(KILLED_EXIT, "", f"sandbox-rs: {message}"))


def filesystem(message: str, hint: str) -> SandboxError:
    return FileSystemError(message, hint=hint or None)
