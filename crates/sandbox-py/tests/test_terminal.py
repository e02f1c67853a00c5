"""``RustSandbox.terminal``: a command with a pseudo-terminal (sandbox-rs's PTY, which
sandboxio's protocol does not have). On both engines: the program sees a terminal of the
size asked for, keystrokes reach it, a resize reaches it as a new size, end of input ends
a program reading lines, and leaving the context kills what still runs. The fake has no
terminal and refuses it; a bad size is refused before anything runs."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from sandboxio.errors import CapabilityNotSupported, ConfigurationError

from engines import SOCKETS, TEMPLATE, engines, register_run_filter
from sandbox_rs import DockerBackend, FakeBackend, PodmanBackend, _native

pytestmark = pytest.mark.anyio

SESSION = f"io.sandbox-rs.session={_native.session_id()}"
BACKENDS = {"docker": DockerBackend, "podman": PodmanBackend}

# Prints whether stdin is a terminal and its size, then the size again after each line
# it reads, until end of input.
SIZES = (
    "import os, sys\n"
    "def size():\n"
    "    s = os.get_terminal_size(0)\n"
    "    print('size', s.lines, s.columns, flush=True)\n"
    "print('tty', os.isatty(0), os.isatty(1), os.isatty(2), flush=True)\n"
    "size()\n"
    "for line in sys.stdin:\n"
    "    print('got', line.strip(), flush=True)\n"
    "    size()\n"
    "print('eof', flush=True)\n"
)


@pytest.fixture(params=engines())
def backend(request: pytest.FixtureRequest) -> Any:
    engine = request.param
    register_run_filter(engine, SESSION)
    return BACKENDS[engine](endpoint=f"unix://{SOCKETS[engine]}", default_template=TEMPLATE)


async def _until(term: Any, text: str, seen: list[str]) -> str:
    """Reads the terminal's output until it holds ``text`` (bounded)."""
    with anyio.fail_after(30):
        async for chunk in term:
            assert chunk.stream == "stdout", chunk
            seen.append(chunk.data.decode(errors="replace"))
            if text in "".join(seen):
                return "".join(seen)
    raise AssertionError(f"the output ended before {text!r}: {''.join(seen)!r}")


async def test_a_terminal_takes_keys_sizes_and_end_of_input(backend: Any) -> None:
    async with await backend.create(timeout=120) as sb:
        async with sb.terminal(["python3", "-c", SIZES], rows=30, cols=100) as term:
            seen: list[str] = []
            out = await _until(term, "size 30 100", seen)
            assert "tty True True True" in out, out
            await term.resize(40, 120)
            await term.write("hello\r")
            out = await _until(term, "size 40 120", seen)
            assert "got hello" in out, out
            await term.end()
            result = await term.wait()
            assert result.exit_code == 0, "".join(seen)
            assert term.returncode == 0


async def test_leaving_the_context_kills_a_running_terminal(backend: Any) -> None:
    async with await backend.create(timeout=120) as sb:
        async with sb.terminal(["sh", "-c", "echo ready; exec sleep 300"]) as term:
            await _until(term, "ready", [])
        assert term.returncode is not None and term.returncode != 0
        r = await sb.run(["sh", "-c", "ps -o comm= | grep -c '^sleep$' || true"])
        assert r.stdout.strip() == "0", r


async def test_a_bad_size_is_refused_before_anything_runs() -> None:
    sb = await FakeBackend().create()
    async with sb:
        for rows, cols in [(0, 80), (24, 0), (70000, 80), (-1, 80)]:
            with pytest.raises(ConfigurationError):
                sb.terminal(["true"], rows=rows, cols=cols)


async def test_the_fake_has_no_terminal() -> None:
    async with await FakeBackend().create() as sb:
        with pytest.raises(CapabilityNotSupported) as refused:
            async with sb.terminal(["true"]):
                pass
        assert refused.value.__cause__.code == "SBX_E1101"
        assert "PTY" in str(refused.value)
