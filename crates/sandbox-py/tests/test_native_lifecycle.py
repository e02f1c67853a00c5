"""The lifecycle sandbox-rs adds beyond sandboxio's protocol, reached through ``.native``
(sandboxio's rule: what its suite cannot test is not declared to it): pause and resume,
stop and start, extend up to ``max_lifetime``, filesystem snapshots, and forks (refused
with the typed error where the engine cannot make them). On both engines, through the
engines' own sockets; every sandbox made here is killed and removed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from engines import SOCKETS, TEMPLATE, cli, engines, register_run_filter
from sandbox_rs import DockerBackend, PodmanBackend, _native

NativeError = _native.SandboxError
SESSION = f"io.sandbox-rs.session={_native.session_id()}"
BACKENDS = {"docker": DockerBackend, "podman": PodmanBackend}

pytestmark = pytest.mark.anyio


@pytest.fixture(params=engines())
def backend(request: pytest.FixtureRequest) -> Any:
    engine = request.param
    register_run_filter(engine, SESSION)
    b = BACKENDS[engine](endpoint=f"unix://{SOCKETS[engine]}", default_template=TEMPLATE)
    b.engine_name = engine
    return b


async def test_pause_and_resume_keep_the_processes_and_files(backend: Any) -> None:
    async with await backend.create(timeout=120) as sb:
        await sb.files.write("/tmp/state", "kept")
        await sb.native.pause()
        with pytest.raises(NativeError) as paused:
            await sb.native.read("/tmp/state")
        assert paused.value.code == "SBX_E1206", paused.value
        await sb.native.resume()
        r = await sb.run(["cat", "/tmp/state"])
        assert (r.exit_code, r.stdout) == (0, "kept")


async def test_stop_and_start_keep_the_files(backend: Any) -> None:
    async with await backend.create(timeout=120) as sb:
        await sb.files.write("/tmp/state", "kept")
        await sb.native.stop()
        with pytest.raises(NativeError) as stopped:
            await sb.native.read("/tmp/state")
        assert stopped.value.code == "SBX_E1207", stopped.value
        await sb.native.start()
        r = await sb.run(["cat", "/tmp/state"])
        assert (r.exit_code, r.stdout) == (0, "kept")


async def test_extend_moves_the_deadline_up_to_the_maximum(backend: Any) -> None:
    async with await backend.create(timeout=60, max_lifetime=120) as sb:
        before = time.time()
        deadline = await sb.native.extend(30)
        assert before + 60 + 25 < deadline <= before + 120 + 2, deadline - before
        with pytest.raises(NativeError) as past:
            await sb.native.extend(3600)
        assert past.value.code == "SBX_E1402", past.value
        with pytest.raises(NativeError) as bad:
            await sb.native.extend(-1)
        assert bad.value.code == "SBX_E1000", bad.value
    async with await backend.create(timeout=60) as sb:
        with pytest.raises(NativeError) as fixed:
            await sb.native.extend(10)
        assert fixed.value.code == "SBX_E1402", "without max_lifetime the deadline is final"


async def test_a_snapshot_is_a_template_with_the_files(backend: Any) -> None:
    template = None
    try:
        async with await backend.create(timeout=120) as sb:
            await sb.files.write("/work/state", "baked")
            template = await sb.native.snapshot()
        async with await backend.create(template=template, timeout=120) as copy:
            r = await copy.run(["cat", "/work/state"])
            assert (r.exit_code, r.stdout) == (0, "baked")
    finally:
        if template is not None:
            cli(backend.engine_name, "rmi", "-f", template, check=False)


async def test_fork_where_undeclared_is_the_typed_refusal(backend: Any) -> None:
    async with await backend.create(timeout=120) as sb:
        assert "SNAPSHOT_FORK" not in sb.native.capabilities
        with pytest.raises(NativeError) as refused:
            await sb.native.fork(2)
        assert refused.value.code == "SBX_E1101", refused.value
