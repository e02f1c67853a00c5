"""Timings of sandbox-rs's ``rsdocker`` backend beside sandboxio's reference ``docker``
adapter on the same engine and image: medians of interleaved rounds (each round measures
every operation on both backends, alternating which goes first), printed as the Markdown
table docs/python.md shows.

    python compare.py [--rounds 7] [--creates 5] [--template sandbox-rs/python:3.11] [--check]

Create is sampled ``--creates`` times per round on each backend, alternating backends
sample by sample, after one unmeasured create per backend: a create is ~90% the engine's
container start, whose time swings by a third on a shared 2-core machine, so one sample a
round (what this script took before) gave ratios anywhere from 0.8 to 1.2 between runs.
The first create of each backend (client setup, image check) is printed apart. Beside
``create``, ``create + first run`` is the time until a first command has run: sandbox-rs
returns with its in-sandbox agent ready, the reference with ``sleep`` started (its first
exec then still costs an engine exec).

``--pool N`` adds, apart from the table, the time of ``WarmPool.acquire`` with ready spares
(a pool of N on rsdocker, the opt-in warm pool): not like for like (the reference has no
pool, and a spare's lifetime started when the pool made it), so never in the table.

``--check`` exits non-zero unless rsdocker's ``run(["true"])`` is at least 10x faster than
the reference's. Create is reported, not checked: even the median of 15 samples moves by
~10% between runs here, more than the difference it would check.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio

MIB = b"x" * (1024 * 1024)
OPS = ["create", 'create + first run(["true"])', 'run(["true"])', 'run_code("print(1)")', "1 MiB write+read", "10x create+run+kill"]


async def _create(backend: Any, template: str) -> Any:
    return await backend.create(template=template, timeout=120)


async def create_sample(backend: Any, template: str) -> tuple[float, float]:
    """One create on ``backend``: seconds until it returned, and until a first
    ``run(["true"])`` in it returned; the sandbox is killed after."""
    t = time.perf_counter()
    sb = await _create(backend, template)
    created = time.perf_counter() - t
    try:
        res = await sb.run(["true"])
        first = time.perf_counter() - t
        assert res.exit_code == 0, res
    finally:
        await sb.kill()
    return created, first


async def measure(backend: Any, template: str) -> dict[str, float]:
    """One round of every operation but create on ``backend``; seconds per operation."""
    out: dict[str, float] = {}
    sb = await _create(backend, template)
    try:
        await sb.run(["true"])  # first exec warms the path; measured below
        runs = []
        for _ in range(10):
            t = time.perf_counter()
            res = await sb.run(["true"])
            runs.append(time.perf_counter() - t)
            assert res.exit_code == 0, res
        out['run(["true"])'] = statistics.median(runs)
        t = time.perf_counter()
        res = await sb.run_code("print(1)")
        out['run_code("print(1)")'] = time.perf_counter() - t
        assert res.stdout == "1\n", res
        t = time.perf_counter()
        await sb.files.write("/work/blob.bin", MIB)
        back = await sb.files.read("/work/blob.bin")
        out["1 MiB write+read"] = time.perf_counter() - t
        assert back == MIB
    finally:
        await sb.kill()

    async def one() -> None:
        s = await _create(backend, template)
        try:
            assert (await s.run(["true"])).exit_code == 0
        finally:
            await s.kill()

    t = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(one)
    out["10x create+run+kill"] = time.perf_counter() - t
    return out


def fmt(seconds: float) -> str:
    ms = seconds * 1000
    if ms < 1:
        return f"{ms:.2f} ms"
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--creates", type=int, default=5)
    ap.add_argument("--pool", type=int, default=0)
    ap.add_argument("--template", default="sandbox-rs/python:3.11")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()

    import sandboxio_docker

    from sandbox_rs import DockerBackend

    backends = {
        "sandbox-rs (rsdocker)": DockerBackend(),
        "sandboxio-docker 0.1.0": sandboxio_docker.DockerBackend(image=args.template, reaper=False),
    }
    samples: dict[str, dict[str, list[float]]] = {n: {op: [] for op in OPS} for n in backends}
    names = list(backends)
    # First use apart: the native backend opened, docker-py's client made, the image checked.
    cold = {n: (await create_sample(backends[n], args.template))[0] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for i in range(args.creates):
            for name in order if i % 2 == 0 else order[::-1]:
                created, first = await create_sample(backends[name], args.template)
                samples[name]["create"].append(created)
                samples[name]['create + first run(["true"])'].append(first)
        for name in order:
            for op, secs in (await measure(backends[name], args.template)).items():
                samples[name][op].append(secs)
    med = {n: {op: statistics.median(v) for op, v in ops.items()} for n, ops in samples.items()}
    rs, ref = med[names[0]], med[names[1]]
    print(f"| operation ({args.rounds} interleaved rounds, medians) | {names[0]} | {names[1]} | speed-up |")
    print("| --- | ---: | ---: | ---: |")
    for op in OPS:
        print(f"| `{op}` | {fmt(rs[op])} | {fmt(ref[op])} | {ref[op] / rs[op]:.1f}x |")
    pairs = list(zip(samples[names[0]]["create"], samples[names[1]]["create"]))
    not_slower = sum(1 for ours, theirs in pairs if ours <= theirs)
    print(
        f"\ncreate: {len(pairs)} samples each ({args.creates} a round, alternating); "
        f"{names[0]} no slower in {not_slower} of {len(pairs)} adjacent pairs; "
        f"first create (unmeasured above): {fmt(cold[names[0]])} and {fmt(cold[names[1]])}"
    )
    if args.pool:
        from sandbox_rs import WarmPool

        acquired = []
        async with WarmPool(backends[names[0]], size=args.pool, template=args.template, timeout=120) as pool:
            for _ in range(args.rounds * args.creates):
                await pool.wait_ready(timeout=60)
                t = time.perf_counter()
                sb = await pool.acquire()
                acquired.append(time.perf_counter() - t)
                await sb.kill()
        print(
            f"WarmPool.acquire with a spare ready (opt-in, not in the table: no pool on the "
            f"other side): {fmt(statistics.median(acquired))}, median of {len(acquired)}"
        )
    if args.check:
        if ref['run(["true"])'] / rs['run(["true"])'] < 10:
            print('compare: run(["true"]) is less than 10x faster', file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
