"""Which URLs the service may fetch on a tenant's behalf (server-side request forgery policy).

A tenant names URLs the service then calls: datasets (``data_s3_path: https://...``), reward
endpoints (Nova Lambda contract, Cloud Run), the generator, an MLflow server, an output location. An
allow-list decides: ``http``/``https`` to public addresses and object-store URIs (``s3://``, ``gs://``,
``hf://``) are allowed; a host that is, or resolves to, a loopback, link-local, private, shared,
multicast or reserved address is refused unless the operator allows private networks
(``openrft serve --allow-private-urls``); ``file://`` and other schemes are refused, and so are
local paths (the caller checks those, since only it knows which fields are paths).

Host names are resolved when the job is submitted; every address they resolve to must pass. In a tenant's
job the same rule holds again when each connection is made (``OutboundPolicy``, applied by the clients of
``openrft.calls.transport``): the name is resolved once, every address checked, and the connection made to a
checked address, so a name that answered a public address at submission and a loopback one later (DNS
rebinding) is refused then. The job process learns whether it is a tenant's from ``POLICY_ENV``.

Object stores are reached with the operator's credentials, so the service only names, for a tenant, a
location under a prefix the operator allowed that tenant (``store_refusal``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import urlparse

FETCH_SCHEMES = ("http", "https")
STORE_SCHEMES = ("s3", "gs", "gcs", "hf")  # reached through the operator's configured clients and endpoints


Address = ipaddress.IPv4Address | ipaddress.IPv6Address
POLICY_ENV = "OPENRFT_OUTBOUND_POLICY"
"""Set to ``public`` in a tenant's job process (and its Ray workers) whose operator did not allow private
networks: its clients then connect only to public addresses. Unset: the operator's own job, nothing checked."""


def _addresses(host: str) -> list[Address]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError, OSError):
        return []
    return _unique(str(info[4][0]) for info in infos)


def _unique(addresses) -> list[Address]:
    found: list[Address] = []
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if address not in found:
            found.append(address)
    return found


def _is_internal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv4Address) and address in ipaddress.ip_network("100.64.0.0/10"))
    )


def refusal(url: str, allow_private: bool) -> str | None:
    """Why the service must not fetch ``url`` for a tenant, or None when it may."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in STORE_SCHEMES:
        return None
    if scheme not in FETCH_SCHEMES:
        if scheme == "file" or not scheme:
            return "is a file on the server; upload the file (POST /v1/files) and use its id"
        return f"has scheme {scheme!r}; allowed: {', '.join(FETCH_SCHEMES + STORE_SCHEMES)}"
    try:
        host = parsed.hostname
    except ValueError:
        host = None
    if not host:
        return "has no host"
    if allow_private:
        return None
    addresses = _addresses(host)
    if not addresses:
        return f"names host {host!r}, which does not resolve"
    internal = [str(a) for a in addresses if _is_internal(a)]
    if internal:
        return (
            f"reaches {internal[0]}, a loopback, link-local or private address: the service does not call "
            "internal addresses for tenants (the operator allows them with openrft serve --allow-private-urls)"
        )
    return None


def _store_form(url: str) -> str:
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    return f"{'gs' if scheme == 'gcs' else scheme}://{rest}"


def is_store_url(url: str) -> bool:
    return urlparse(url).scheme.lower() in STORE_SCHEMES


def store_refusal(url: str, prefixes: tuple[str, ...]) -> str | None:
    """Why a tenant may not name the object-store location ``url``, or None when it lies under one of
    ``prefixes`` (whole path parts: ``s3://b/team`` allows ``s3://b/team/x``, not ``s3://b/team-b``)."""
    form = _store_form(url)
    parts = form.split("://", 1)[1].split("/")
    if any(part in (".", "..") for part in parts):
        return "has a '.' or '..' part; name the object-store location plainly"
    for prefix in prefixes:
        allowed = _store_form(prefix).rstrip("/")
        if form == allowed or form.startswith(allowed + "/"):
            return None
    shown = ", ".join(prefixes) if prefixes else "none"
    return (
        "is an object-store location, reached with the service's own credentials: a tenant may name only "
        f"locations under the prefixes the operator allowed its API key (allowed: {shown}; the operator "
        "allows one with openrft serve --allow-store-prefix KEY=PREFIX)"
    )


def redirect_refusal(source: str, target: str) -> str | None:
    """Why a redirect from ``source`` to ``target`` must not be followed: another scheme than http(s), or
    another host that is internal (a public endpoint may not bounce a call onto the service's network).
    Checked whatever the operator allows, since an endpoint the operator chose stays where it is."""
    parsed, origin = urlparse(target), urlparse(source)
    if parsed.scheme.lower() not in FETCH_SCHEMES:
        return f"redirects to {target!r}, not an http(s) URL"
    if parsed.hostname and parsed.hostname != origin.hostname:
        internal = [str(a) for a in _addresses(parsed.hostname) if _is_internal(a)]
        if internal:
            return f"redirects to {target!r}, an internal address ({internal[0]}) of another host"
    return None


class OutboundRefused(Exception):
    """A connection the outbound policy does not make (the host resolved, at call time, to an internal address,
    or did not resolve). Raised where the connection would be made; never retried."""


@dataclass(frozen=True)
class OutboundPolicy:
    """The addresses a tenant's job may connect to: public ones only."""

    def refuses(self, address: Address) -> bool:
        return _is_internal(address)

    def connect_addresses(self, host: str, port: int) -> list[str]:
        """The addresses to connect ``host:port`` to, each checked; OutboundRefused when any address the one
        lookup answered is internal (or there is none). The caller connects to these, never to the name."""
        try:
            answers = _unique([host.strip("[]")])
        except ValueError:
            answers = _unique(self._lookup(host, port))
        if not answers:
            raise OutboundRefused(f"{host} does not resolve (the service connects to tenants' hosts it can check)")
        internal = [str(a) for a in answers if self.refuses(a)]
        if internal:
            raise OutboundRefused(
                f"{host} resolved, when the call was made, to {internal[0]}, a loopback, link-local or private "
                "address: the service does not call internal addresses for tenants"
            )
        return [str(a) for a in answers]

    def _lookup(self, host: str, port: int) -> list[str]:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError):
            return []
        return [str(info[4][0]) for info in infos]


def tenant_job(environ: MutableMapping[str, str], allow_private: bool) -> None:
    """Mark ``environ`` as a tenant's job's: its connections follow the policy the submission check applied
    (none when the operator allows private networks: ``openrft serve --allow-private-urls``)."""
    if allow_private:
        environ.pop(POLICY_ENV, None)
    else:
        environ[POLICY_ENV] = "public"


TENANT_CALLS: ContextVar[OutboundPolicy | None] = ContextVar("openrft_outbound_policy", default=None)
"""The policy of the calls made in this context for a tenant, in a process whose other calls are the operator's."""


@contextmanager
def applying(policy: OutboundPolicy | None) -> Iterator[None]:
    """``policy`` for the calls made in this context (the service validating a tenant's job reads its dataset URLs
    in the server's own process, whose other calls are the operator's)."""
    token = TENANT_CALLS.set(policy)
    try:
        yield
    finally:
        TENANT_CALLS.reset(token)


def process_policy() -> OutboundPolicy | None:
    """The policy for the URLs a tenant wrote, here: the context's (``applying``), else this process's. None in
    the operator's own jobs (``openrft train``, a loopback server without API keys): loopback servers are normal."""
    applied = TENANT_CALLS.get()
    if applied is not None:
        return applied
    return OutboundPolicy() if os.environ.get(POLICY_ENV) == "public" else None
