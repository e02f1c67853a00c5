"""Brokered credentials: a secret the sandbox's code never sees.

A ``Credential`` binds a value to destination hosts and to one place in a request (a
header, or a query parameter). Inside the sandbox ``env_var`` holds an opaque
placeholder; the host-side proxy that the sandbox's own firewall rules send the bound
hosts' traffic through swaps it for the value on HTTPS requests to those hosts only
(docs/credentials.md). The value is kept out of ``repr`` and handed to Rust, where it
becomes a ``Secret``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sandboxio.errors import ConfigurationError

__all__ = ["Credential"]


@dataclass(frozen=True)
class Credential:
    """A brokered credential for ``create(credentials=[...])``.

    Exactly one of ``header`` (a header name; ``template`` holds ``{}`` once, where the
    value goes, e.g. ``"Bearer {}"``) or ``query`` (a query parameter's name) says where
    the value goes. Host names, the variable name and the template are checked by
    sandbox-rs at create (``ConfigurationError`` with the fix).
    """

    env_var: str
    value: str = field(repr=False)
    hosts: tuple[str, ...] = ()
    header: str | None = None
    template: str = "{}"
    query: str | None = None

    @classmethod
    def bearer(cls, env_var: str, value: str, hosts: tuple[str, ...] | list[str]) -> Credential:
        """``Authorization: Bearer <value>`` to ``hosts``."""
        return cls(env_var, value, tuple(hosts), header="Authorization", template="Bearer {}")

    def _native(self) -> tuple[str, str, list[str], str, str, str]:
        if isinstance(self.hosts, str):
            raise ConfigurationError(
                f"Credential({self.env_var!r}): hosts is one string, not a list of hosts.",
                hint=f"Pass hosts=({self.hosts!r},).",
            )
        if (self.header is None) == (self.query is None):
            raise ConfigurationError(
                f"Credential({self.env_var!r}) needs exactly one of header= or query=.",
                hint='Pass header="Authorization" (with template="Bearer {}") or query="key".',
            )
        if self.header is not None:
            return (self.env_var, self.value, list(self.hosts), "header", self.header, self.template)
        return (self.env_var, self.value, list(self.hosts), "query", str(self.query), "")
