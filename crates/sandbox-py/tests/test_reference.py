"""The same suite on sandboxio's reference Docker adapter (``sandboxio-docker`` 0.1.0 from
the package index), on the same engine, image, canary and fault proxy, for the side-by-side
table in docs/python.md. Runs only when ``SBX_PY_REFERENCE=1`` (``cargo xtask python``
sets it) and the adapter is installed.

The reference gets the probes that observe the engine or inject faults below it; it keeps
the suite's default for the credential probe, as it reads no credential of its own.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("SBX_PY_REFERENCE") != "1":
    pytest.skip("SBX_PY_REFERENCE=1 runs the reference adapter", allow_module_level=True)

import docker  # noqa: E402
import sandboxio_docker  # noqa: E402
from sandboxio.audit import AuditConfig  # noqa: E402
from sandboxio.testing.suite import BackendContractSuite, RecordingSink  # noqa: E402
from sandboxio_docker._reaper import SESSION_ID  # noqa: E402

from engines import SOCKETS, TEMPLATE, EngineProbes, register_run_filter  # noqa: E402
import sandbox_rs_testkit  # noqa: E402

_proxy = sandbox_rs_testkit.FaultProxy(SOCKETS["docker"])
_sink = RecordingSink()
_session = f"io.sandboxio.session={SESSION_ID}"
register_run_filter("docker", _session)


class TestSandboxioDocker(EngineProbes, BackendContractSuite):
    """sandboxio-docker 0.1.0 (its Ryuk reaper off: its image is not on this machine)."""

    engine = "docker"
    proxy = _proxy
    session_label = _session
    meta_prefix = "io.sandboxio.meta."
    native_error = docker.errors.APIError
    backend = sandboxio_docker.DockerBackend(
        image=TEMPLATE,
        reaper=False,
        audit=AuditConfig(sinks=(_sink,)),
        client=docker.DockerClient(base_url=_proxy.endpoint),
    )
    template = TEMPLATE
    audit_sink = _sink

    def simulate_missing_credential(self):  # type: ignore[override]
        return BackendContractSuite.simulate_missing_credential(self)
