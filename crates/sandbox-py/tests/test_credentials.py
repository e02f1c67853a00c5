"""Brokered credentials from Python (``create(credentials=[Credential(...)])``): the value
stays out of every ``repr`` and error, a malformed credential is refused before anything
is made, and a well-formed one reaches the backend, which enforces it or refuses it (the
fake has no egress path; an engine refuses a host that resolves to this machine). The
broker itself (placeholder inside, the value sent to the bound host only, HTTPS through
the sandbox's CA) is the Rust code these calls reach, proven against real engines by
``sandbox_testkit::trials::credentials`` on Docker and Podman."""

from __future__ import annotations

from typing import Any

import pytest
from sandboxio.errors import ConfigurationError
from sandboxio.models import NetworkPolicy

from engines import SOCKETS, TEMPLATE, engines, register_run_filter
from sandbox_rs import Credential, DockerBackend, FakeBackend, PodmanBackend, _native

pytestmark = pytest.mark.anyio

VALUE = "sk-live-do-not-leak-4b1f"
SESSION = f"io.sandbox-rs.session={_native.session_id()}"
BACKENDS = {"docker": DockerBackend, "podman": PodmanBackend}


def _text(exc: BaseException) -> str:
    """Everything an error shows: its text, hint and every cause's."""
    parts = []
    while exc is not None:
        parts += [str(exc), repr(exc), str(getattr(exc, "hint", ""))]
        exc = exc.__cause__ or exc.__context__
    return " ".join(parts)


def test_the_value_is_not_in_repr() -> None:
    c = Credential.bearer("API_KEY", VALUE, ("api.example.com",))
    assert VALUE not in repr(c)
    assert c._native() == (
        "API_KEY",
        VALUE,
        ["api.example.com"],
        "header",
        "Authorization",
        "Bearer {}",
    )
    q = Credential("MAPS_KEY", VALUE, ("maps.example.com",), query="key")
    assert q._native()[3:5] == ("query", "key")


@pytest.mark.parametrize(
    "bad",
    [
        Credential("API_KEY", VALUE, ("api.example.com",)),
        Credential("API_KEY", VALUE, ("api.example.com",), header="X-Key", query="key"),
        Credential("API_KEY", VALUE, "api.example.com", header="X-Key"),  # type: ignore[arg-type]
    ],
    ids=["no-placement", "two-placements", "hosts-as-one-string"],
)
async def test_a_malformed_credential_is_refused_in_python(bad: Credential) -> None:
    with pytest.raises(ConfigurationError) as refused:
        await FakeBackend().create(network=NetworkPolicy(egress="allow"), credentials=[bad])
    assert VALUE not in _text(refused.value)


async def test_what_is_not_a_credential_is_refused() -> None:
    with pytest.raises(ConfigurationError):
        await FakeBackend().create(credentials=[("API_KEY", VALUE)])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("network", "credential", "says"),
    [
        (
            NetworkPolicy(egress="deny"),
            Credential.bearer("API_KEY", VALUE, ("api.example.com",)),
            "egress Deny",
        ),
        (
            NetworkPolicy(egress="allow"),
            Credential.bearer("API_KEY", VALUE, ("127.0.0.1",)),
            "not a host name",
        ),
        (
            NetworkPolicy(egress="allow"),
            Credential("API_KEY", VALUE, ("api.example.com",), header="X-Key", template="no slot"),
            "{}",
        ),
    ],
    ids=["no-network", "an-address", "template-without-slot"],
)
async def test_sandbox_rs_checks_the_credential_before_anything_is_made(
    network: NetworkPolicy, credential: Credential, says: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        await FakeBackend().create(network=network, credentials=[credential])
    text = _text(refused.value)
    assert says in text, text
    assert VALUE not in text


async def test_the_fake_refuses_credentials_it_cannot_broker() -> None:
    """sandboxio's ``Capability`` has no CREDENTIALS, so the native refusal
    (``SBX_E1101``, kept as ``__cause__``) is a ``ConfigurationError`` naming it."""
    with pytest.raises(ConfigurationError) as refused:
        await FakeBackend().create(
            network=NetworkPolicy(egress="allow"),
            credentials=[Credential.bearer("API_KEY", VALUE, ("api.example.com",))],
        )
    assert refused.value.__cause__.code == "SBX_E1101"
    assert "CREDENTIALS" in str(refused.value)
    assert VALUE not in _text(refused.value)


@pytest.mark.parametrize("engine", engines())
async def test_an_engine_refuses_a_host_that_resolves_to_this_machine(engine: str) -> None:
    """``localhost`` resolves to the host's own address, where the proxy (which connects
    from the host, outside the sandbox's rules) would reach this machine's services: the
    engine backend refuses the create, with nothing left behind (the session's leak
    check) and the value in no part of the error."""
    register_run_filter(engine, SESSION)
    backend: Any = BACKENDS[engine](endpoint=f"unix://{SOCKETS[engine]}", default_template=TEMPLATE)
    with pytest.raises(ConfigurationError) as refused:
        await backend.create(
            timeout=60,
            network=NetworkPolicy(egress="allow"),
            credentials=[Credential.bearer("API_KEY", VALUE, ("localhost",))],
        )
    text = _text(refused.value)
    assert "localhost" in text, text
    assert VALUE not in text
