"""Generation with vLLM's ``LLM`` engine in the learner's process (``rollout.engine: vllm``).

The colocated mode of TRL's ``vllm_mode="colocate"`` and verl's hybrid engine: no server, no HTTP; the
engine holds its own copy of the weights. Each policy version reaches it as in the server mode: a LoRA
adapter written as a PEFT directory and passed by ``LoRARequest`` (a new id per version), or the full
weights written as safetensors files, one per block (``rollout/weight_files.py``), and reloaded in place by
the workers' ``reload_weights`` (``LLM.collective_rpc``), the prefix cache then dropped. vLLM's sleep
mode (freeing the engine's GPU memory while the learner updates) is not driven yet: on one GPU, size
``gpu_memory_utilization`` for both.

vLLM pins its own torch and transformers, so this runs where OpenRFT is installed into vLLM's
environment (``make vllm-venv`` builds it, ``VLLM_WITH_OPENRFT=1`` adds OpenRFT); elsewhere the engine
is refused by name.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from openrft.algo.rollout_correction import truncates
from openrft.errors import OpenRFTError
from openrft.rollout.remote import write_peft_adapter
from openrft.rollout.sync_probe import ProbeSet
from openrft.rollout.types import Completion, PolicyVersioned, SamplingParams
from openrft.spec.job import LoraSpec


def import_vllm():
    # the engine core and its one worker in this process (no engine subprocess importing vLLM and the
    # model again, no worker pipe): the learner and the engine then share this process's threads
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as exc:
        raise OpenRFTError(
            f"rollout.engine 'vllm' needs vLLM importable in the job's Python ({exc}): run the job from vLLM's "
            "virtualenv with OpenRFT installed there (make vllm-venv VLLM_WITH_OPENRFT=1), or serve vLLM "
            "(scripts/vllm_server.sh) and set rollout.generator_base_url"
        ) from None
    return vllm


class VllmGenerator(PolicyVersioned):
    """A ``Generator`` backed by ``vllm.LLM`` (processed log-probs: the density sampled)."""

    def __init__(
        self,
        model_path: str,
        *,
        adapter_dir: Path,
        lora: LoraSpec,
        eos_token_ids: list[int],
        max_model_len: int,
        dtype: str = "float32",
        seed: int = 0,
        gpu_memory_utilization: float = 0.4,
    ):
        vllm = import_vllm()
        self.adapter_dir, self.lora, self.model_path = Path(adapter_dir), lora, model_path
        self.eos_token_ids = list(eos_token_ids)
        self.llm = vllm.LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            enable_lora=lora.enabled,
            max_lora_rank=max(lora.rank, 8) if lora.enabled else 16,
            max_loras=2,
            enable_chunked_prefill=False,  # seeded requests crash the CPU backend with it on
            logprobs_mode="processed_logprobs",
            distributed_executor_backend="uni",
            **({"gpu_memory_utilization": gpu_memory_utilization} if torch.cuda.is_available() else {}),
        )
        self._lora_request = None
        self._adapter_path: Path | None = None
        self.probe_engine = ("vllm", dtype)  # the sync probe's tolerance (rollout/sync_probe.py)

    def load_adapter(self, weights: dict[str, torch.Tensor], version: int) -> None:
        from vllm.lora.request import LoRARequest

        directory = self.adapter_dir / f"v{version}"
        if self.lora.enabled:
            write_peft_adapter(weights, self.lora, self.model_path, directory)
            self._lora_request = LoRARequest(f"openrft-v{version}", version + 1, str(directory.resolve()))
        else:
            from openrft.rollout.weight_files import write_weight_files

            write_weight_files(weights, directory)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(directory.resolve())})
            self.llm.reset_prefix_cache()
        if self._adapter_path is not None and self._adapter_path != directory:
            shutil.rmtree(self._adapter_path, ignore_errors=True)
        self._adapter_path, self._version = directory, version

    def score(self, probe: ProbeSet) -> list[list[float]]:
        """The probe's continuation log-probs as the engine computes them for the policy it serves (vLLM's
        ``prompt_logprobs``: the raw distribution, temperature 1)."""
        import vllm

        requests = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(probe.prompts, probe.continuations)]
        sampling = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        outputs = self.llm.generate(requests, sampling, lora_request=self._lora_request, use_tqdm=False)
        scores = []
        for prompt, continuation, output in zip(probe.prompts, probe.continuations, outputs):
            entries = output.prompt_logprobs[len(prompt) :]
            scores.append(
                [float(e[t].logprob) if e and t in e else float("nan") for t, e in zip(continuation, entries)]
            )
        return scores

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        import vllm

        if not prompts:
            return []
        truncated = truncates(params.top_k, params.top_p, params.min_p)
        requests, sampling = [], []
        for index, prompt in enumerate(prompts):
            requests.append({"prompt_token_ids": list(prompt)})
            sampling.append(
                vllm.SamplingParams(
                    n=params.n,
                    temperature=params.temperature,
                    top_k=params.top_k if params.top_k > 0 else -1,
                    top_p=params.top_p,
                    min_p=params.min_p,
                    max_tokens=params.completion_limit(len(prompt)),
                    stop_token_ids=[] if params.ignore_eos else self.eos_token_ids,
                    ignore_eos=params.ignore_eos,
                    logprobs=0,
                    seed=None if seed is None else seed + index,
                )
            )
        outputs = self.llm.generate(requests, sampling, lora_request=self._lora_request, use_tqdm=False)
        groups = []
        for prompt, output in zip(prompts, outputs):
            group = []
            for choice in output.outputs:
                logprobs = [
                    float(step[token].logprob) if step and token in step else float("nan")
                    for token, step in zip(choice.token_ids, choice.logprobs or [None] * len(choice.token_ids))
                ]
                group.append(
                    Completion(
                        prompt_ids=list(prompt),
                        token_ids=list(choice.token_ids),
                        logprobs=logprobs,
                        text=choice.text,
                        finish_reason="stop" if choice.finish_reason == "stop" else "length",
                        policy_version=self._version,
                        logprobs_truncated=truncated,
                    )
                )
            groups.append(group)
        return groups

    def close(self) -> None:
        del self.llm
