"""The probes sandboxio's ``BackendContractSuite`` asks an adapter for, answered for real.

Observations (sandbox count, applied resources, labels, surviving processes) come from
the engine's own CLI, never from the adapter under test. Faults come from the fault
proxy the backend is opened through (removals and creates that hang or fail, a registry
that demands a credential); the canary is an HTTP server this run starts inside the
egress lab's network namespace on this machine. Nothing here sends traffic off the
machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import anyio.to_thread

import sandbox_rs_testkit

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from sandboxio.models import Resources

SOCKETS = {"docker": "/var/run/docker.sock", "podman": "/run/podman/podman.sock"}
TEMPLATE = "sandbox-rs/python:3.11"
# What each engine's credential store is configured through (the variable sandbox-rs
# names in its AuthError).
CREDENTIAL_ENV = {"docker": "DOCKER_CONFIG", "podman": "REGISTRY_AUTH_FILE"}

# Label filters naming this run's containers, per engine: added to by each adapter class.
_RUN_FILTERS: list[tuple[str, str]] = []
_canary: Any = None


def canary() -> Any:
    """The canary server, started on first use (root: it creates a network namespace)."""
    global _canary
    if _canary is None:
        _canary = sandbox_rs_testkit.Canary()
    return _canary


def close_canary() -> None:
    global _canary
    if _canary is not None:
        _canary.close()
        _canary = None


def cli(engine: str, *args: str, check: bool = True) -> str:
    out = subprocess.run(
        [engine, *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and out.returncode != 0:
        raise AssertionError(f"`{engine} {' '.join(args)}` failed: {out.stderr.strip()}")
    return out.stdout


def containers(engine: str, label: str) -> list[str]:
    """Ids of every container (stopped ones too) carrying ``label`` (``k=v``)."""
    return cli(engine, "ps", "-aq", "--no-trunc", "--filter", f"label={label}").split()


def leftovers() -> dict[str, list[str]]:
    """This run's containers still on their engines, after a bounded wait for removals
    in flight (Docker removes asynchronously)."""
    deadline = time.monotonic() + 15
    while True:
        left = {f"{e} {label}": ids for e, label in _RUN_FILTERS if (ids := containers(e, label))}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def register_run_filter(engine: str, label: str) -> None:
    if (engine, label) not in _RUN_FILTERS:
        _RUN_FILTERS.append((engine, label))


def inspect(engine: str, sandbox_id: str) -> dict[str, Any] | None:
    out = subprocess.run(
        [engine, "inspect", "--type", "container", sandbox_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode != 0:
        return None
    data = json.loads(out.stdout)
    return data[0] if data else None


class EngineProbes:
    """Probes for an adapter on ``engine`` opened through ``proxy``.

    ``session_label`` names this run's containers (``k=v``), ``meta_prefix`` the label
    prefix the adapter stores ``metadata`` under.
    """

    engine: ClassVar[str]
    proxy: ClassVar[Any]
    session_label: ClassVar[str]
    meta_prefix: ClassVar[str]
    # sandboxio bounds a create by the sandbox timeout too, and the suite creates with
    # `short_timeout` as the lifetime: its default 0.5 s is less than a container create
    # takes on a loaded 2-core machine (Podman's especially). 1.5 s keeps every timeout
    # trial meaningful (each still waits for a `sleep 3600` to be cut short).
    short_timeout: ClassVar[float] = 1.5

    @property
    def canary_host(self) -> str:  # type: ignore[override]
        return str(canary().host)

    def cmd_egress(self, host: str) -> list[str]:
        # The test image has no curl, and its busybox wget crashes (exit 139) on any URL,
        # which would pass a deny trial vacuously: Python's client exits 0 only on an
        # answer. The canary listens on a port of its own.
        port = canary().port
        fetch = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)"
        return ["python3", "-c", fetch, f"http://{host}:{port}/"]

    async def sandbox_count(self) -> int | None:
        return len(await anyio.to_thread.run_sync(containers, self.engine, self.session_label))

    async def applied_resources(self, sb: Any) -> Resources | None:
        from sandboxio.models import Resources

        info = await anyio.to_thread.run_sync(inspect, self.engine, sb.id)
        assert info is not None, f"sandbox {sb.id} is not on {self.engine}"
        host = info.get("HostConfig") or {}
        memory = int(host.get("Memory") or 0)
        nano = int(host.get("NanoCpus") or 0)
        quota, period = int(host.get("CpuQuota") or 0), int(host.get("CpuPeriod") or 0)
        cpu = nano / 1e9 if nano else (quota / period if quota and period else None)
        return Resources(cpu=cpu, memory_mb=memory // (1024 * 1024) if memory else None)

    async def provider_labels(self, sb: Any) -> Mapping[str, str] | None:
        info = await anyio.to_thread.run_sync(inspect, self.engine, sb.id)
        assert info is not None, f"sandbox {sb.id} is not on {self.engine}"
        labels = (info.get("Config") or {}).get("Labels") or {}
        return {k[len(self.meta_prefix) :]: v for k, v in labels.items() if k.startswith(self.meta_prefix)}

    async def expire_sandbox(self, sb: Any) -> None:
        """The sandbox disappears behind the adapter's back, as when its lifetime ends."""
        await anyio.to_thread.run_sync(lambda: cli(self.engine, "rm", "-f", sb.id))

    def _processes(self, sandbox_id: str) -> list[str] | None:
        """The container's processes other than its own (its PID 1 and the command the
        container was started with, which an engine init runs as PID 1's child), or None
        if it is gone."""
        info = inspect(self.engine, sandbox_id)
        if info is None or not (info.get("State") or {}).get("Running"):
            return None
        pid1 = int((info.get("State") or {}).get("Pid") or 0)
        own = " ".join([str(info.get("Path") or ""), *map(str, info.get("Args") or [])])
        top = ["-eo", "pid,args"] if self.engine == "docker" else ["pid", "args"]
        out = cli(self.engine, "top", sandbox_id, *top, check=False)
        rows = [line.split(None, 1) for line in out.splitlines()[1:] if line.strip()]
        # Docker lists host pids (its PID 1 is State.Pid); Podman lists container pids.
        return [
            " ".join(r)
            for r in rows
            if r and r[0].isdigit() and int(r[0]) not in (pid1, 1) and r[1:] != [own]
        ]

    async def assert_no_orphans(self, sb: Any) -> None:
        """No process survives a cancelled, timed-out or finished operation, and a killed
        sandbox's container is gone. Kills after a cancellation are bounded (the teardown
        grace), so survivors get that long to go."""
        killed = bool(getattr(sb, "_killed", False))
        deadline = time.monotonic() + 6
        while True:
            if killed:
                present = inspect(self.engine, sb.id) is not None
                if not present:
                    return
                survivors = [f"container {sb.id} still exists"]
            else:
                left = await anyio.to_thread.run_sync(self._processes, sb.id)
                survivors = left or []
                if not survivors:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"orphans in sandbox {sb.id}: {survivors}")
            await anyio.sleep(0.1)

    @contextlib.contextmanager
    def _fault(self, kind: str, mode: str) -> Iterator[None]:
        before = set(containers(self.engine, self.session_label))
        getattr(self.proxy, f"set_{kind}")(mode)
        try:
            yield
        finally:
            self.proxy.heal()
            # What a sabotaged kill left behind goes now (the suite's own clean-up does
            # not cover a hung teardown).
            for cid in set(containers(self.engine, self.session_label)) - before:
                cli(self.engine, "rm", "-f", cid, check=False)

    def simulate_kill_hang(self) -> contextlib.AbstractContextManager[None]:
        return self._fault("kill", "hang")

    @contextlib.contextmanager
    def simulate_kill_failure(self) -> Iterator[type[BaseException]]:
        with self._fault("kill", "fail"):
            yield self.native_error

    def simulate_slow_create(self) -> contextlib.AbstractContextManager[None]:
        return self._fault("create", "hang")

    @contextlib.contextmanager
    def simulate_provider_failure(self) -> Iterator[type[BaseException]]:
        with self._fault("create", "fail"):
            yield self.native_error

    @contextlib.contextmanager
    def simulate_missing_credential(self) -> Iterator[str]:
        self.proxy.lock_pulls(self.engine)
        try:
            yield self.credential_env
        finally:
            self.proxy.heal()

    native_error: ClassVar[type[BaseException]]
    credential_env: ClassVar[str] = ""


def engines() -> list[str]:
    """The engines to run on: ``SBX_PY_ENGINES`` (comma-separated), default both."""
    raw = os.environ.get("SBX_PY_ENGINES", "docker,podman")
    return [e.strip() for e in raw.split(",") if e.strip()]
