"""``WarmPool``, sandbox-rs's opt-in warm pool: every spare handed out once and never
again, the pool refilled behind it, every spare killed when the pool closes, and a bad
pool refused before anything is made. On the fake always, on Docker and Podman when they
are among the engines of the run (SBX_PY_ENGINES); the session's leak check covers the
engines' spares."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from sandboxio.errors import ConfigurationError

from engines import TEMPLATE, containers, engines
from sandbox_rs import DockerBackend, FakeBackend, PodmanBackend, WarmPool

pytestmark = pytest.mark.anyio

ENGINES = [e for e in ("docker", "podman") if e in engines()]
BACKENDS = ["fake", *ENGINES]
ENGINE_BACKENDS = {"docker": "DockerBackend", "podman": "PodmanBackend"}


def _backend(kind: str):
    if kind == "fake":
        return FakeBackend()
    return (DockerBackend if kind == "docker" else PodmanBackend)(default_template=TEMPLATE)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_spares_are_handed_out_once_and_refilled(kind: str) -> None:
    async with WarmPool(_backend(kind), size=2, timeout=120) as pool:
        assert await pool.wait_ready(timeout=60) == 2, pool.last_error
        t = time.perf_counter()
        first = await pool.acquire()
        second = await pool.acquire()
        handed = time.perf_counter() - t
        try:
            assert first.id != second.id
            for sb in (first, second):
                res = await sb.run(["echo", "warm"])
                assert (res.exit_code, res.stdout) == (0, "warm\n")
            # Both were ready: no engine round trip (a create takes hundreds of ms here).
            assert handed < 0.1, f"two ready spares took {handed:.3f} s"
            # The pool makes new spares; the handed-out ones never come back.
            assert await pool.wait_ready(timeout=60) == 2, pool.last_error
            third = await pool.acquire()
            try:
                assert third.id not in (first.id, second.id)
            finally:
                await third.kill()
        finally:
            await first.kill()
            await second.kill()


@pytest.mark.parametrize("kind", BACKENDS)
async def test_closing_kills_every_spare_and_refuses_more(kind: str) -> None:
    backend = _backend(kind)
    # Only this pool's spares carry this label (other programs may use the engine too).
    mine = {"warm-pool-test": uuid.uuid4().hex}
    pool = WarmPool(backend, size=2, timeout=120, metadata=mine)
    assert await pool.wait_ready(timeout=60) == 2, pool.last_error
    assert len(await backend.list_managed(labels=mine)) == 2
    await pool.aclose()
    assert (pool.ready, pool.creating) == (0, 0)
    listed = await backend.list_managed(labels=mine)
    assert not [m for m in listed if m.state == "running"], listed
    with pytest.raises(ConfigurationError, match="closed"):
        await pool.acquire()
    await pool.aclose()  # idempotent


@pytest.mark.parametrize("size", [0, 257])
async def test_a_pool_size_out_of_range_is_refused(size: int) -> None:
    with pytest.raises(ConfigurationError, match="pool size"):
        WarmPool(FakeBackend(), size=size)


EXITS_WITHOUT_CLOSING = textwrap.dedent(
    """
    import sys
    import anyio
    import sandbox_rs

    async def main():
        global pool  # alive until the interpreter's exit, as a module-level pool would be
        backend = getattr(sandbox_rs, sys.argv[3])(default_template=sys.argv[1])
        pool = sandbox_rs.WarmPool(backend, size=3, timeout=120,
                                   metadata={"warm-pool-test": sys.argv[2]})
        print(await pool.wait_ready(2, timeout=60), flush=True)

    anyio.run(main)
    """
)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_pool_never_closed_is_closed_at_exit(engine: str) -> None:
    # The interpreter exits with spares ready and, most likely, one still being created.
    tag = uuid.uuid4().hex
    done = subprocess.run(
        [sys.executable, "-c", EXITS_WITHOUT_CLOSING, TEMPLATE, tag, ENGINE_BACKENDS[engine]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 2, done.stdout
    # Asked of the engine's CLI, not of a backend (whose startup sweep would remove what
    # a dead process left); a few seconds for a removal the engine finishes on its own.
    label = f"io.sandbox-rs.meta.warm-pool-test={tag}"
    deadline = time.monotonic() + 3
    while (left := containers(engine, label)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"spares outlived their process: {left}"
