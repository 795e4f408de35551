"""Generation on a remote OpenAI-compatible server that serves LoRA adapters by name: vLLM or ours.

Only the part of vLLM's API that vLLM documents is used:

- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and ``POST /v1/unload_lora_adapter``
  ``{"lora_name"}`` (vLLM: ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Each
  policy version is written as a PEFT adapter directory and loaded under a new, version-suffixed
  name (vLLM refuses to load a name twice); the previous version is then unloaded. ``lora_path`` is
  read by the server, so the adapter directory must be on a filesystem the server sees.
- Full fine-tuning (no LoRA): each policy version is written as safetensors files, one per decoder block
  (``rollout/weight_files.py``), in a directory the server reads, then loaded by ``POST /v1/load_weights``
  ``{"path"}`` (``openrft serve-model``), or on a vLLM server by ``POST /collective_rpc``
  ``{"method": "reload_weights", "kwargs": {"weights_path"}}`` (vLLM's development-mode RPC route,
  ``VLLM_SERVER_DEV_MODE=1``, calling its workers' own in-place ``reload_weights``, which reads the
  directory's safetensors in checkpoint format and re-runs the kernels' weight processing) followed by
  ``POST /reset_prefix_cache`` (cached prompt KV of the old weights must not be reused).
- ``POST /v1/completions`` with the prompts as token ids (``prompt: list[list[int]]``), ``n``,
  ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``max_tokens``, ``stop_token_ids`` (with ``sampling.ignore_eos``
  none, and ``ignore_eos: true``), ``logprobs: 0`` (the
  sampled token's log-prob only) and ``return_tokens_as_token_ids: true`` (tokens come back as
  ``token_id:N``, so the completion's token ids are exact, not re-tokenized text). Choices come
  back prompt by prompt, ``n`` each, in ``index`` order.

The density of the returned log-probs is checked before the first generation (``probe_logprob_mode``):
vLLM's ``--logprobs-mode processed_logprobs`` reports the distribution actually sampled (temperature,
then top-k / top-p / min-p, renormalised): completions are flagged ``logprobs_truncated`` when truncation
is on, and the learner compares on that support. ``raw_logprobs`` ignores temperature and truncation, so
it is refused unless sampling is plain (temperature 1, no truncation).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import torch

from openrft.algo.rollout_correction import truncates
from openrft.calls.endpoints import sync_client
from openrft.calls.outbound import OutboundRefused
from openrft.errors import OpenRFTError
from openrft.rollout.sync_probe import ProbeSet
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.rollout.weight_files import write_weight_files
from openrft.rollout.weight_transfer import FILES, choose_full_weights_path, log_choice
from openrft.spec.job import LoraSpec

TRANSIENT_STATUS = {429, 500, 502, 503, 504}


class GenerationServerError(OpenRFTError):
    """The generation server refused a request (``status``: its HTTP status) or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


NO_WEIGHTS_ROUTE = (
    "takes no full weights: it has neither POST /v1/load_weights (openrft serve-model) nor vLLM's "
    "POST /collective_rpc. Start vLLM with VLLM_SERVER_DEV_MODE=1 (scripts/vllm_server.sh does), serve the "
    "model with openrft serve-model, or train LoRA"
)
WEIGHTS_RPC = "reload_weights"
PROBE_TEMPERATURES = (1.0, 2.0)


def classify_logprob_mode(at_t1: float, at_t2: float) -> str:
    """The density a server reports, from the log-prob of the argmax token sampled with ``top_k=1`` at
    temperatures 1 and 2: ``processed`` (the truncated distribution: exactly one token, log-prob 0),
    ``raw`` (the model's own, unscaled: the same at both temperatures) or ``scaled`` (temperature-scaled,
    untruncated: OpenRFT's generators)."""
    if abs(at_t1) < 1e-5 and abs(at_t2) < 1e-5:
        return "processed"
    if abs(at_t1 - at_t2) < 1e-5 * max(1.0, abs(at_t1)):
        return "raw"
    return "scaled"


def lora_target_modules(weights: dict[str, torch.Tensor]) -> list[str]:
    """Module names that carry LoRA weights (``...q_proj.lora_A.weight`` -> ``q_proj``)."""
    names = {key.split(".lora_")[0].rsplit(".", 1)[-1] for key in weights if ".lora_" in key}
    if not names:
        raise ValueError("the weights hold no LoRA matrices (lora_A / lora_B)")
    return sorted(names)


def write_peft_adapter(weights: dict[str, torch.Tensor], lora: LoraSpec, base_model: str, directory: Path) -> Path:
    """A PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``) from the
    policy's adapter state, loadable by vLLM and ``PeftModel.from_pretrained``."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        bias="none",
        target_modules=lora_target_modules(weights),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )
    config.save_pretrained(str(directory))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory


def parse_token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise GenerationServerError(
            f"the server returned token {token!r}, not 'token_id:N': it ignored "
            "return_tokens_as_token_ids (vLLM supports it; is this a vLLM server?)"
        )
    return int(token.split(":", 1)[1])


class RemoteGenerator(PolicyVersioned):
    """A ``Generator`` whose samples come from ``base_url`` (``http://host:8000`` or ``.../v1``).
    ``generate`` may be called from several threads at once (one ``httpx.Client``, which is thread-safe):
    tool episodes keep ``concurrent_requests`` batches in flight and the server batches them together."""

    concurrent_requests = 8

    def __init__(
        self,
        base_url: str,
        *,
        adapter_dir: Path,
        lora: LoraSpec,
        base_model: str,
        eos_token_ids: list[int],
        adapter_prefix: str = "openrft",
        served_model: str | None = None,
        timeout_s: float = 600.0,
        retries: int = 3,
        api_key: str | None = None,
    ):
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else f"{root}/v1"
        api_key = api_key or os.environ.get("OPENRFT_GENERATOR_API_KEY")  # openrft serve-model --api-key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = sync_client(base_url=self.base_url, timeout=timeout_s, headers=headers, follow_redirects=False)
        self.adapter_dir, self.lora, self.base_model = Path(adapter_dir), lora, base_model
        self.eos_token_ids, self.adapter_prefix, self.retries = list(eos_token_ids), adapter_prefix, retries
        self.served_model = served_model
        self._adapter: str | None = None
        self._weights_dir: Path | None = None  # full fine-tuning: the file the server last loaded
        # full fine-tuning on vLLM: how the weights travel (rollout/weight_transfer.py), chosen at the first update
        self.full_weights_path: str | None = None
        self.full_weights_reason = ""
        self.logprob_mode: str | None = None  # processed / raw / scaled, probed before the first generation

    # adapters -----------------------------------------------------------------------------------

    def load_adapter(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """The policy's weights: a LoRA adapter loaded by name, or (full fine-tuning) the whole model."""
        if not self.lora.enabled:
            self._load_full_weights(weights, version)
            return
        name = f"{self.adapter_prefix}-v{version}"
        path = write_peft_adapter(weights, self.lora, self.base_model, self.adapter_dir / name)
        if name == self._adapter:  # the same version again (the sync probe's re-load): replace it on the server
            self._post("/unload_lora_adapter", {"lora_name": name})
        self._load_lora(name, path)
        previous, self._adapter, self._version = self._adapter, name, version
        if previous and previous != name:
            self._post("/unload_lora_adapter", {"lora_name": previous})
            shutil.rmtree(self.adapter_dir / previous, ignore_errors=True)

    def _load_lora(self, name: str, path: Path) -> None:
        """Load the adapter by name; a name the server already holds (a resumed job against a server that
        kept running) is reloaded in place (vLLM's ``load_inplace``): its weights may be another run's."""
        body = {"lora_name": name, "lora_path": str(path.resolve())}
        try:
            self._post("/load_lora_adapter", body)
        except GenerationServerError as exc:
            if exc.status != 400 or "already been loaded" not in str(exc):
                raise
            self._post("/load_lora_adapter", {**body, "load_inplace": True})

    def _load_full_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Full fine-tuning: the weights as safetensors files the server reads (``POST /v1/load_weights``),
        a file per block (``write_weight_files``)."""
        directory = self.adapter_dir / f"{self.adapter_prefix}-v{version}"
        write_weight_files(weights, directory)
        try:
            self._post("/load_weights", {"path": str(directory.resolve())})
        except GenerationServerError as exc:
            if exc.status not in (404, 405):
                raise
            self._load_weights_by_rpc(directory)
        if self._weights_dir not in (None, directory):  # the server holds the new weights: drop the old file
            shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._weights_dir, self._version = directory, version

    def _load_weights_by_rpc(self, directory: Path) -> None:
        """vLLM: its workers reload their weights from the directory (``collective_rpc``), then its prefix cache
        is dropped. The first time, the way is chosen by what the server offers (``choose_full_weights_path``;
        the route path is never the outcome yet) and logged."""
        root = self.base_url.removesuffix("/v1")
        if self.full_weights_path is None:
            self.full_weights_path, self.full_weights_reason = choose_full_weights_path(
                lambda url: self.client.get(url), root
            )
            log_choice(root, self.full_weights_path, self.full_weights_reason)
        assert self.full_weights_path == FILES
        body = {"method": WEIGHTS_RPC, "kwargs": {"weights_path": str(directory.resolve())}}
        try:
            self._call("POST", f"{root}/collective_rpc", body)
        except GenerationServerError as exc:
            if exc.status in (404, 405):
                raise GenerationServerError(f"the generation server at {root} {NO_WEIGHTS_ROUTE}", exc.status) from None
            raise
        self._call("POST", f"{root}/reset_prefix_cache", None)

    # the sync probe -------------------------------------------------------------------------------

    probe_engine = ("server", "unknown")  # the server's dtype is not visible to its client

    def score(self, probe: ProbeSet) -> list[list[float]]:
        """The probe's continuation log-probs as the server computes them for the policy it serves: one
        ``/completions`` request per probe row with ``prompt_logprobs: 0`` (vLLM's prompt log-probs, each
        position's entry keyed by the prompt token's id), temperature 1, one token generated."""
        scores = []
        for prompt, continuation in zip(probe.prompts, probe.continuations):
            body = {
                "model": self._adapter or self._base_name(),
                "prompt": [list(prompt) + list(continuation)],
                "max_tokens": 1,
                "temperature": 1.0,
                "prompt_logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
            entries = self._post("/completions", body).json()["choices"][0].get("prompt_logprobs")
            if not entries or len(entries) != len(prompt) + len(continuation):
                raise GenerationServerError(
                    f"{self.base_url}/completions returned no prompt_logprobs for the sync probe (vLLM and openrft "
                    "serve-model return them): turn the probe off with rollout.sync_probe.enabled false"
                )
            row = []
            for token, entry in zip(continuation, entries[len(prompt) :]):
                value = (entry or {}).get(str(token))
                row.append(float("nan") if value is None else float(value["logprob"]))
            scores.append(row)
        return scores

    # log-prob density -----------------------------------------------------------------------------

    def probe_logprob_mode(self, prompt: list[int]) -> str:
        """Which density the server's log-probs are (``classify_logprob_mode``): two one-token requests."""
        values = []
        for temperature in PROBE_TEMPERATURES:
            body = {
                "model": self._adapter or self._base_name(),
                "prompt": [list(prompt)],
                "max_tokens": 1,
                "temperature": temperature,
                "top_k": 1,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                "seed": 0,
            }
            choice = self._post("/completions", body).json()["choices"][0]
            values.append(float(self._completion(prompt, choice).logprobs[0]))
        self.logprob_mode = classify_logprob_mode(*values)
        return self.logprob_mode

    def _check_logprob_mode(self, prompt: list[int], params: SamplingParams) -> None:
        if self.logprob_mode is None:
            self.probe_logprob_mode(prompt)
        plain = params.temperature in (0.0, 1.0) and not truncates(params.top_k, params.top_p, params.min_p)
        if self.logprob_mode == "raw" and not plain:
            raise GenerationServerError(
                f"the generation server at {self.base_url} reports raw log-probs (vLLM --logprobs-mode "
                f"raw_logprobs), which ignore temperature {params.temperature}, top_k {params.top_k}, top_p "
                f"{params.top_p} and min_p {params.min_p}: start it with --logprobs-mode processed_logprobs"
            )

    # generation ---------------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        if not prompts:
            return []
        self._check_logprob_mode(prompts[0], params)
        by_limit: dict[int, list[int]] = {}  # one request per completion limit (max_length per sample)
        for index, prompt in enumerate(prompts):
            by_limit.setdefault(params.completion_limit(len(prompt)), []).append(index)
        groups: list[list[Completion]] = [[] for _ in prompts]
        for limit, indices in by_limit.items():
            for index, group in zip(indices, self._request([prompts[i] for i in indices], params, limit, seed)):
                groups[index] = group
        return groups

    def _request(
        self, prompts: list[list[int]], params: SamplingParams, max_tokens: int, seed: int | None
    ) -> list[list[Completion]]:
        body = {
            "model": self._adapter or self._base_name(),
            "prompt": [list(p) for p in prompts],
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "min_p": params.min_p,
            "max_tokens": max_tokens,
            "stop_token_ids": [] if params.ignore_eos else self.eos_token_ids,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        if params.ignore_eos:
            body["ignore_eos"] = True
        if seed is not None:
            body["seed"] = seed
        choices = sorted(self._post("/completions", body).json()["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts) * params.n:
            raise GenerationServerError(
                f"{self.base_url}/completions returned {len(choices)} choices for {len(prompts)} prompts x n={params.n}"
            )
        truncated = self.logprob_mode == "processed" and truncates(params.top_k, params.top_p, params.min_p)
        groups = [
            [self._completion(prompt, c) for c in choices[p * params.n : (p + 1) * params.n]]
            for p, prompt in enumerate(prompts)
        ]
        for completion in (c for group in groups for c in group):
            completion.logprobs_truncated = truncated
        return groups

    def _completion(self, prompt: list[int], choice: dict) -> Completion:
        logprobs = choice.get("logprobs") or {}
        tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
        if tokens is None or values is None or len(tokens) != len(values):
            raise GenerationServerError(f"{self.base_url}/completions returned a choice without token log-probs")
        return Completion(
            prompt_ids=list(prompt),
            token_ids=[parse_token_id(t) for t in tokens],
            logprobs=[float("nan") if v is None else float(v) for v in values],  # missing: neutral, counted
            text=choice.get("text") or "",
            finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
            policy_version=self._version,
        )

    def _base_name(self) -> str:
        if self.served_model is None:
            data = self._get("/models").json()["data"]
            self.served_model = next((m["id"] for m in data if not m.get("parent")), data[0]["id"])
        return self.served_model

    # HTTP ---------------------------------------------------------------------------------------

    def _get(self, path: str) -> httpx.Response:
        return self._call("GET", path, None)

    def _post(self, path: str, body: dict) -> httpx.Response:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict | None) -> httpx.Response:
        url = path if path.startswith("http") else f"{self.base_url}{path}"  # vLLM's own routes are not under /v1
        for attempt in range(self.retries + 1):
            try:
                response = self.client.request(method, path, json=body)
            except OutboundRefused as exc:  # the same address again: not worth a retry
                raise GenerationServerError(f"the generation server at {url} is not called: {exc}") from None
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise GenerationServerError(
                        f"cannot reach the generation server at {url}: {type(exc).__name__}: {exc}"
                    ) from None
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in TRANSIENT_STATUS or attempt == self.retries:
                    raise GenerationServerError(
                        f"{method} {url} failed with HTTP {response.status_code}: {_error_message(response)}",
                        response.status_code,
                    )
            time.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.client.close()


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return response.text[:500]
