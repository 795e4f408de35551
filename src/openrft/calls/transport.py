"""Connections made only to addresses the outbound policy checked: the transports of a tenant's job's clients.

The submission check (``openrft.calls.outbound.refusal``) resolves a tenant's host names once, when the job is
submitted; a name may answer differently later (DNS rebinding: a public address then, 127.0.0.1 now). In a
tenant's job (``outbound.process_policy``) the clients made here resolve the host when they connect, check every
address the lookup answered, and connect to a checked address, never to the name again: TLS still verifies the
certificate against the name (SNI) and the Host header is the URL's. A redirect is a new request, so its
target is checked the same way. Environment proxies are not used there: a proxy would resolve the name itself.

The clients are made in one place: ``openrft.calls.endpoints.async_client`` and ``sync_client`` (httpx, with
these transports when a policy applies), ``mcp_http_client`` here (httpx2, the MCP SDK's) and MLflow's requests
sessions (``use_for_mlflow``). tests/calls/test_outbound_clients.py fails when a client is made anywhere else.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from openrft.calls.outbound import OutboundPolicy, OutboundRefused, process_policy


class _AsyncBackend:
    """An httpcore (or httpcore2) network backend that connects only to addresses the policy checked."""

    def __init__(self, policy: OutboundPolicy, inner: Any):
        self.policy, self.inner = policy, inner

    async def connect_tcp(self, host: str, port: int, timeout=None, local_address=None, socket_options=None):
        addresses = await asyncio.to_thread(self.policy.connect_addresses, host, port)
        return await _first_connecting(
            addresses, lambda a: self.inner.connect_tcp(a, port, timeout, local_address, socket_options)
        )

    async def connect_unix_socket(self, path: str, timeout=None, socket_options=None):
        raise OutboundRefused("a tenant's call does not go through a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


async def _first_connecting(addresses: list[str], connect) -> Any:
    error: BaseException | None = None
    for address in addresses:
        try:
            return await connect(address)
        except Exception as exc:  # the next checked address (IPv6 then IPv4, say)
            error = exc
    assert error is not None
    raise error


class _SyncBackend:
    def __init__(self, policy: OutboundPolicy, inner: Any):
        self.policy, self.inner = policy, inner

    def connect_tcp(self, host: str, port: int, timeout=None, local_address=None, socket_options=None):
        error: BaseException | None = None
        for address in self.policy.connect_addresses(host, port):
            try:
                return self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except Exception as exc:
                error = exc
        assert error is not None
        raise error

    def connect_unix_socket(self, path: str, timeout=None, socket_options=None):
        raise OutboundRefused("a tenant's call does not go through a unix socket")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


def _checked(transport: Any, backend_class: type, policy: OutboundPolicy) -> Any:
    # the pool's backend makes every TCP connection of the transport (httpx builds the pool; it takes no backend)
    pool = transport._pool
    pool._network_backend = backend_class(policy, pool._network_backend)
    return transport


def async_transport(policy: OutboundPolicy, **kwargs: Any) -> httpx.AsyncHTTPTransport:
    """An httpx transport that connects only to addresses ``policy`` checked (no environment proxies)."""
    return _checked(httpx.AsyncHTTPTransport(trust_env=False, **kwargs), _AsyncBackend, policy)


def sync_transport(policy: OutboundPolicy, **kwargs: Any) -> httpx.HTTPTransport:
    return _checked(httpx.HTTPTransport(trust_env=False, **kwargs), _SyncBackend, policy)


def mcp_http_client(*, policy: OutboundPolicy | None = None) -> Any:
    """An httpx2.AsyncClient (the MCP SDK's HTTP library) with the SDK's timeouts (30 s; 300 s to read a held
    stream); the SDK follows redirects itself, only within the endpoint's origin."""
    import httpx2

    checked = policy or process_policy()
    timeout = httpx2.Timeout(30.0, read=300.0)
    if checked is None:
        return httpx2.AsyncClient(timeout=timeout)
    transport = _checked(httpx2.AsyncHTTPTransport(trust_env=False), _AsyncBackend, checked)
    return httpx2.AsyncClient(timeout=timeout, transport=transport, trust_env=False)


def requests_adapter(policy: OutboundPolicy, base: type) -> type:
    """A subclass of the requests ``HTTPAdapter`` class ``base`` whose connections go to checked addresses
    (urllib3 connects to ``_dns_host``, set to the checked address while the socket is made)."""
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def new_conn(parent: type):
        def _new_conn(self):
            name = self._dns_host  # also the host TLS and the Host header use: put back once connected
            self._dns_host = policy.connect_addresses(name, self.port)[0]
            try:
                return parent._new_conn(self)
            finally:
                self._dns_host = name

        return _new_conn

    http_conn = type("CheckedHTTPConnection", (HTTPConnection,), {"_new_conn": new_conn(HTTPConnection)})
    https_conn = type("CheckedHTTPSConnection", (HTTPSConnection,), {"_new_conn": new_conn(HTTPSConnection)})
    http_pool = type("CheckedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": http_conn})
    https_pool = type("CheckedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": https_conn})

    class CheckedAdapter(base):  # type: ignore[misc, valid-type]
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}

        def proxy_manager_for(self, proxy: Any, **kwargs: Any) -> Any:
            raise OutboundRefused("a tenant's call does not go through a proxy (it would resolve the name itself)")

    return CheckedAdapter


def use_for_mlflow(policy: OutboundPolicy | None = None) -> None:
    """In a tenant's job, MLflow's HTTP sessions (made by ``mlflow.utils.request_utils`` from its adapter class,
    looked up when each session is made) connect only to checked addresses; in an operator's job, MLflow's own
    adapter again (a process that ran a tenant's job before must not keep its policy). Call before the first MLflow
    call."""
    checked = policy or process_policy()
    from mlflow.utils import request_utils

    base = getattr(request_utils.TCPKeepAliveHTTPAdapter, "openrft_base", request_utils.TCPKeepAliveHTTPAdapter)
    if checked is None:
        adapter = base
    else:
        adapter = requests_adapter(checked, base)
        adapter.openrft_base = base
    if request_utils.TCPKeepAliveHTTPAdapter is not adapter:
        request_utils.TCPKeepAliveHTTPAdapter = adapter
        request_utils._cached_get_request_session.cache_clear()
