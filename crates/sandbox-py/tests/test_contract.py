"""sandboxio 0.1.0's own conformance suite, unchanged, on sandbox-rs's Docker and Podman
backends (`rsdocker`, `rspodman`), with every probe the suite asks for provided."""

from __future__ import annotations

from typing import Any

from sandboxio.audit import AuditConfig
from sandboxio.testing.suite import BackendContractSuite, RecordingSink

from engines import (
    CREDENTIAL_ENV,
    SOCKETS,
    TEMPLATE,
    EngineProbes,
    engines,
    register_run_filter,
)
import sandbox_rs_testkit
from sandbox_rs import DockerBackend, PodmanBackend, _native

SESSION = f"io.sandbox-rs.session={_native.session_id()}"


def _suite(engine: str, backend_cls: type[Any]) -> type[Any]:
    proxy = sandbox_rs_testkit.FaultProxy(SOCKETS[engine])
    sink = RecordingSink()
    register_run_filter(engine, SESSION)
    backend = backend_cls(
        endpoint=proxy.endpoint, audit=AuditConfig(sinks=(sink,)), default_template=TEMPLATE
    )

    class Suite(EngineProbes, BackendContractSuite):
        pass

    Suite.engine = engine
    Suite.proxy = proxy
    Suite.session_label = SESSION
    Suite.meta_prefix = "io.sandbox-rs.meta."
    Suite.credential_env = CREDENTIAL_ENV[engine]
    Suite.native_error = _native.SandboxError
    Suite.backend = backend
    Suite.template = TEMPLATE
    Suite.audit_sink = sink
    Suite.allowlist_supported = backend.allowlist_supported
    return Suite


# One class per engine; SBX_PY_ENGINES picks them (CI runs both).
if "docker" in engines():
    TestRsDocker = _suite("docker", DockerBackend)
    TestRsDocker.__name__ = TestRsDocker.__qualname__ = "TestRsDocker"
if "podman" in engines():
    TestRsPodman = _suite("podman", PodmanBackend)
    TestRsPodman.__name__ = TestRsPodman.__qualname__ = "TestRsPodman"
