"""What the reward functions of one job share: an HTTP client, the sandbox pool, the LLM judge.

Built once per RewardSpec by the factory and closed with the top-level reward function. Each
piece is made on first use, inside the event loop that uses it (the RewardRunner's).
"""

from __future__ import annotations

import asyncio

import httpx

from openrft.outbound import redirect_refusal
from openrft.rewards.judge import JUDGE_TIMEOUT_S, ChatJudge, judge_api_key, require_base_url
from openrft.rewards.remote import RemoteEndpoint
from openrft.rewards.sandbox import SandboxPool
from openrft.spec.rewards import RewardSpec


class RewardContext:
    def __init__(self, spec: RewardSpec):
        self.spec = spec
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._pool: SandboxPool | None = None
        self._judge: ChatJudge | None = None
        self.endpoints: list[RemoteEndpoint] = []

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
            hooks = {"response": [_refuse_inward_redirects]}
            self._client = httpx.AsyncClient(limits=limits, follow_redirects=True, event_hooks=hooks)
            self._client_loop = loop
        return self._client

    def endpoint(
        self, url: str, default_timeout_s: float, label: str, headers: dict[str, str] | None = None
    ) -> RemoteEndpoint:
        endpoint = RemoteEndpoint(url, self.spec.remote, default_timeout_s, label, _LazyClient(self), headers)
        self.endpoints.append(endpoint)
        return endpoint

    def pool(self) -> SandboxPool:
        """The sandbox pool; made (and its isolation checked) when a reward needing it is built."""
        if self._pool is None:
            self._pool = SandboxPool(self.spec.sandbox)
        return self._pool

    def judge(self) -> ChatJudge:
        if self._judge is None:
            url = require_base_url(self.spec.judge) + "/chat/completions"
            key = judge_api_key(self.spec.judge)
            headers = {"Authorization": f"Bearer {key}"} if key else None
            self._judge = ChatJudge(self.endpoint(url, JUDGE_TIMEOUT_S, "LLM judge", headers), self.spec.judge)
        return self._judge

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


class _LazyClient:
    """Stands in for an httpx client until the first request, made inside the running loop."""

    def __init__(self, context: RewardContext):
        self.context = context

    def build_request(self, *args, **kwargs) -> httpx.Request:
        return self.context.client().build_request(*args, **kwargs)

    async def send(self, *args, **kwargs) -> httpx.Response:
        return await self.context.client().send(*args, **kwargs)


class RedirectRefused(httpx.TransportError):
    """A redirect the outbound policy does not follow (``openrft.outbound.redirect_refusal``)."""


async def _refuse_inward_redirects(response: httpx.Response) -> None:
    if not response.has_redirect_location:
        return
    source = str(response.request.url)
    target = str(response.request.url.join(response.headers["location"]))
    reason = await asyncio.to_thread(redirect_refusal, source, target)
    if reason:
        raise RedirectRefused(f"{source} {reason}", request=response.request)
