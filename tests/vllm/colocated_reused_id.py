"""Run by tests/vllm/test_vllm_colocated_probe.py with vLLM's Python: the colocated job with a planted fault, every
version handed to vLLM under one LoRA name and id (vLLM caches an adapter by its id, so it keeps the first one);
prints what the job ended with, as JSON."""

from __future__ import annotations

import json
import sys

from openrft.engine import RFTJob
from openrft.engine.local_runtime import LocalRuntime
from openrft.engine.sync_check import SyncProbeError
from openrft.rollout.remote import write_peft_adapter
from openrft.spec.dialects import load_job
from openrft.spec.rewards import RewardSpec

# rewards that differ between samples (tests/conftest.py's FUZZY_REWARD), so every step moves the policy
FUZZY = {
    "function": {
        "type": "openai_grader",
        "grader": {
            "type": "text_similarity",
            "name": "fuzzy",
            "input": "{{sample.output_text}}",
            "reference": "{{item.reference_answer}}",
            "evaluation_metric": "fuzzy_match",
        },
    }
}


class ReusedLoraId(LocalRuntime):
    def generation_replicas(self, spec, parts, learner, run_dir):
        replicas = super().generation_replicas(spec, parts, learner, run_dir)
        generator = replicas[0].generator

        def load_adapter(weights, version: int) -> None:
            from vllm.lora.request import LoRARequest

            directory = generator.adapter_dir / f"v{version}"
            write_peft_adapter(weights, generator.lora, generator.model_path, directory)
            generator._lora_request = LoRARequest("openrft", 1, str(directory.resolve()))  # the fault
            generator._version = version

        generator.load_adapter = load_adapter
        return replicas


def main(recipe: str, run_dir: str) -> None:
    spec = load_job(recipe)
    spec.reward = RewardSpec.model_validate(FUZZY)
    spec.evaluation.at_start = False
    try:
        RFTJob(spec, run_dir, show_progress=False, runtime=ReusedLoraId()).run()
    except SyncProbeError as exc:
        print(json.dumps({"caught": str(exc)}))
        return
    print(json.dumps({"caught": None}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
