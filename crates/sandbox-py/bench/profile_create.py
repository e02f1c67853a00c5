"""Where a create's time goes, on sandbox-rs's ``rsdocker`` backend and on sandboxio's
reference ``docker`` adapter: both clients talk to the engine through a logging proxy on a
temporary unix socket (started here, relaying to the real one), and every engine request
sent inside a create is listed in order with the median of its latency (request sent to
first response byte) and of the client's own time before it, over interleaved creates.
The proxy runs on its own thread and event loop (both clients make blocking calls on first
use) and delays every request of both alike (the reference sends four, sandbox-rs three),
so the totals here are a little above compare.py's.

    python profile_create.py [--creates 10] [--template sandbox-rs/python:3.11] [--socket /var/run/docker.sock]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio

METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ")
# Once an attach is answered the connection carries the agent's stream, not HTTP.
HIJACK = (b"101 UPGRADED", b"application/vnd.docker.raw-stream", b"application/vnd.docker.multiplexed-stream")


class Proxy:
    """Relays a unix socket to the engine's, noting (sent, first byte, request line)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.log: list[tuple[float, float, str]] = []
        self.loop = asyncio.new_event_loop()

    def start(self, path: str) -> None:
        """Serves `path` on a daemon thread of its own until the process ends."""
        ready = threading.Event()

        async def serve() -> None:
            await asyncio.start_unix_server(self.handle, path)
            ready.set()
            await asyncio.Event().wait()

        threading.Thread(target=self.loop.run_until_complete, args=(serve(),), daemon=True).start()
        ready.wait(10)

    async def handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_unix_connection(self.upstream)
        pending: list[tuple[float, str]] = []
        hijacked = False

        async def up() -> None:
            while data := await cr.read(65536):
                if not hijacked and data.startswith(METHODS):
                    pending.append((time.perf_counter(), data.split(b"\r\n", 1)[0].decode()))
                uw.write(data)
                await uw.drain()
            if uw.can_write_eof():
                uw.write_eof()

        async def down() -> None:
            nonlocal hijacked
            while data := await ur.read(65536):
                if pending:
                    sent, line = pending.pop(0)
                    self.log.append((sent, time.perf_counter(), line))
                    hijacked = hijacked or any(h in data[:512] for h in HIJACK)
                cw.write(data)
                await cw.drain()
            cw.close()

        try:
            await asyncio.gather(up(), down())
        except (ConnectionError, OSError):
            pass
        finally:
            uw.close()
            cw.close()


def normalize(line: str) -> str:
    method, target = line.split(" ")[:2]
    path = re.sub(r"^/v1\.\d+", "", target.split("?")[0])
    path = re.sub(r"/containers/(?!create$)[^/]+", "/containers/{id}", path)
    path = re.sub(r"/images/.+/json", "/images/{image}/json", path)
    return f"{method} {path}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=10)
    ap.add_argument("--template", default="sandbox-rs/python:3.11")
    ap.add_argument("--socket", default="/var/run/docker.sock")
    args = ap.parse_args()

    import docker
    import sandboxio_docker

    from sandbox_rs import DockerBackend

    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "engine.sock")
        proxy = Proxy(args.socket)
        proxy.start(sock)
        backends: dict[str, Any] = {
            "sandbox-rs (rsdocker)": DockerBackend(endpoint=f"unix://{sock}"),
            "sandboxio-docker 0.1.0": sandboxio_docker.DockerBackend(
                image=args.template, reaper=False, client=docker.DockerClient(base_url=f"unix://{sock}")
            ),
        }
        windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
        names = list(backends)
        for name in names:  # first use (clients, image check) apart
            await (await backends[name].create(template=args.template, timeout=120)).kill()
        for i in range(args.creates):
            for name in names if i % 2 == 0 else names[::-1]:
                t0 = time.perf_counter()
                sb = await backends[name].create(template=args.template, timeout=120)
                windows[name].append((t0, time.perf_counter()))
                await sb.kill()

    for name in names:
        latency: dict[str, list[float]] = defaultdict(list)
        before: dict[str, list[float]] = defaultdict(list)
        after: list[float] = []
        for t0, t1 in windows[name]:
            prev = t0
            inside = sorted(r for r in list(proxy.log) if t0 <= r[0] <= t1)
            for sent, first, line in inside:
                key = normalize(line)
                latency[key].append(first - sent)
                before[key].append(sent - prev)
                prev = first
            after.append(t1 - prev)
        total = statistics.median(t1 - t0 for t0, t1 in windows[name])
        print(f"\n{name}: create {total * 1000:.1f} ms (median of {len(windows[name])})")
        print("| request | engine, ms | client before it, ms |\n| --- | ---: | ---: |")
        for key in latency:
            print(f"| `{key}` | {statistics.median(latency[key]) * 1000:.1f} | {statistics.median(before[key]) * 1000:.1f} |")
        print(f"| (after the last answer) | | {statistics.median(after) * 1000:.1f} |")


if __name__ == "__main__":
    anyio.run(main)
