"""The sharded learner (FSDP2 over a gloo process group, the blocks' collectives through shared memory or
gloo): two and four ranks under torchrun make the update one learner makes on the same batch, LoRA and
full fine-tuning, with activation checkpointing, CPU offload and uneven micro-batch counts across the ranks;
a step holds at most two blocks gathered; a full fine-tune's
KL reference is sharded too; their checkpoints resume on fewer ranks; the final weights are written in
PEFT / Hugging Face format.

Two torchrun launches (a process's start is most of a run's time): four ranks first, then two ranks,
which also resume the four ranks' checkpoints."""

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from openrft.engine.local_runtime import learner_config
from openrft.learner import Learner, Policy
from openrft.models import load_causal_lm, load_tokenizer, pick_dtype
from openrft.runtime.process_group import free_port
from openrft.runtime.sharded import ShardedWorker
from openrft.spec.dialects import load_job
from tests.conftest import ROOT, small_recipe
from tests.core.test_data_parallel import _samples

# the vocabulary-parallel embedding and LM head (the head a token a time: many chunks, sharded_run.py)
MODES = ("lora", "full")
# activation checkpointing and CPU offload on, micro-batches of 16 tokens (the ranks run different counts)
CHECKPOINTED = ("full-checkpointed", "lora-checkpointed")
# and: algorithm.ppo_mini_batches 3 (three updates a step); a batch of one sample (rank 1 has none)
RUNS = (*MODES, "lora-3-mini-batches", "full-one-sample", *CHECKPOINTED)
FOUR_RANK_RUNS = (*CHECKPOINTED, "full")  # the last: the vocabulary-parallel rows split unevenly, resharded 4 -> 2
UNPACKED_RUNS = ("lora-3-mini-batches", "full-one-sample")  # a prompt pass and a continuation; others packed
GLOO_RUNS = ("lora-3-mini-batches",)  # through gloo's TCP; the others through shared memory (the CPU default)
RESUMED = "resumed-"  # a run that resumes another's step-1 checkpoint (the four ranks', on two)
pytestmark = pytest.mark.slow  # two torchrun processes train the demo model


def sharded_spec(tmp_path, mode: str):
    spec = load_job(small_recipe(tmp_path, max_steps=2))  # kl_loss_coef 0.01: the reference runs too
    spec.lora.enabled = mode.startswith("lora")
    spec.algorithm.ppo_mini_batches = 3 if mode.endswith("mini-batches") else 1
    if mode.endswith("mini-batches"):  # three updates in a step: at lr 2e-3 the later ones are chaotic (KL 60)
        spec.optimizer.lr = 1e-4
    spec.algorithm.refit_freq = 1  # the second step's reference is a refit one (sharded alike)
    spec.rollout.learner_sharding = "fsdp"
    spec.runtime.threads = 1
    if mode.endswith("checkpointed"):
        spec.training.activation_checkpointing, spec.training.micro_batch_tokens = True, 16
        spec.rollout.learner_offload = "cpu"
    # the ranks sum the gradient in another order than one learner (and in two backward calls a pass); the
    # advantages of a group sum to zero, so the gradient is a small difference of large terms and float32
    # order noise moves the update by 1e-5 to 2e-5 relative (measured): compare in float64. One learner's
    # LM head still computes in float32 (``response_logits``, ``ChunkedHeadLogp``), the sharded head in the
    # model's float64: that leaves 3e-7 to 8e-7 (measured), the bound is 1e-5.
    spec.model.dtype = "float64"
    # AdamW's first update is about lr * sign(g) where |g| >> eps, and a smooth function of g only where
    # |g| is near eps: with eps 1e-8, float32 summation-order noise in near-zero gradient entries moves
    # the update by 1e-4 relative (full fine-tuning). eps 1e-3 makes the update a smooth function of
    # the gradient, so comparing updates compares gradients, which agree to float32 noise.
    spec.optimizer.adam_eps = 1e-3
    return spec


def batch(mode: str) -> list:
    return _samples()[:1] if mode.endswith("one-sample") else _samples()


def one_learner(spec) -> Learner:
    torch.manual_seed(spec.training.seed)
    model = load_causal_lm(
        spec.model.name_or_path, torch.device("cpu"), pick_dtype(spec.model.dtype, torch.device("cpu"))
    )
    policy = Policy(model, spec.lora, need_reference=spec.algorithm.kl_loss_coef > 0)
    return Learner(policy, learner_config(spec, load_tokenizer(spec.model.name_or_path).pad_token_id))


def relative_update_error(before: dict, expected: dict, got: dict) -> float:
    """|got - expected| / |expected - before| over every tensor: the update's relative error."""
    error = sum(float(((got[k] - expected[k]) ** 2).sum()) for k in expected) ** 0.5
    update = sum(float(((expected[k] - before[k]) ** 2).sum()) for k in expected) ** 0.5
    assert update > 0
    return error / update


def torchrun(arguments: list[str], ranks: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node RANKS ARGUMENTS`` with this checkout's code, one thread per process."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    launch = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(free_port())]
    return subprocess.run([sys.executable, *launch, *arguments], env=env, capture_output=True, text=True, timeout=600)


def sharded_runs(tmp_path_factory, runs: tuple[str, ...], ranks: int, resume=None) -> tuple[dict, object]:
    """``tests/core/sharded_run.py`` on ``ranks`` torchrun ranks for each of ``runs`` (one process group);
    ``resume``: (a directory of such results, modes) whose step-1 checkpoints these ranks resume too."""
    spec_dir, out = tmp_path_factory.mktemp("specs"), tmp_path_factory.mktemp("out")
    resumed = [f"{RESUMED}{mode}" for mode in (resume[1] if resume else ())]
    for mode in (*runs, *resumed):
        spec = sharded_spec(spec_dir, mode.removeprefix(RESUMED))
        (spec_dir / f"{mode}.json").write_text(spec.model_dump_json())
    extra = [str(resume[0])] if resume else []
    result = torchrun([str(ROOT / "tests" / "core" / "sharded_run.py"), str(spec_dir), str(out), *extra], ranks)
    assert result.returncode == 0, result.stderr[-4000:]
    return {mode: torch.load(out / f"{mode}.pt", weights_only=False) for mode in (*runs, *resumed)}, out


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Checkpointed and vocabulary-parallel runs on four ranks, two steps each, a checkpoint after the first."""
    return sharded_runs(tmp_path_factory, FOUR_RANK_RUNS, 4)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, four_ranks):
    """Every run on two ranks (one process group), and the four ranks' step-1 checkpoints resumed there
    for the second step (``resumed-<mode>``)."""
    return sharded_runs(tmp_path_factory, RUNS, 2, resume=(four_ranks[1], FOUR_RANK_RUNS))[0]


@pytest.fixture
def one_rank_group():
    """This process as a process group of one (gloo), for loading a two-rank checkpoint."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_learner_steps() -> dict:
    """One learner's step per mode, taken once (the same at two and four ranks)."""
    return {}


@pytest.mark.parametrize("ranks, mode", [*((2, mode) for mode in RUNS), *((4, mode) for mode in FOUR_RANK_RUNS)])
def test_sharded_ranks_make_one_learners_update(request, one_learner_steps, tmp_path, ranks, mode):
    runs = request.getfixturevalue("two_ranks") if ranks == 2 else request.getfixturevalue("four_ranks")[0]
    spec = sharded_spec(tmp_path, mode)
    if mode not in one_learner_steps:
        learner = one_learner(spec)
        if mode in MODES:  # log-probs from the LM head a token at a time (sharded_run.py: the same)
            learner.config.logits_chunk_bytes = 1
        before = learner.policy.adapter_state()
        metrics = learner.step(batch(mode))
        whole = sum(p.numel() for p in learner.policy.model.parameters())
        one_learner_steps[mode] = before, learner.policy.adapter_state(), metrics, whole
    before, expected, metrics, whole = one_learner_steps[mode]
    got = runs[mode]["step1"]
    assert sorted(got) == sorted(expected)
    error = relative_update_error(before, expected, got)
    assert error <= 1e-5, error
    sharded = runs[mode]["metrics"][0]
    assert sharded["actor/trained_tokens"] == metrics["actor/trained_tokens"]  # the global batch's
    assert sharded.get("actor/updates") == metrics.get("actor/updates")
    for key in ("actor/grad_norm", "actor/entropy", "actor/kl", "actor/pg_loss", "actor/pg_clipfrac"):
        assert sharded[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key
    if mode in MODES:  # the gradient norm was clipped to max_grad_norm 1.0: clipping used the global norm
        assert metrics["actor/grad_norm"] > spec.optimizer.max_grad_norm
    assert runs[mode]["transport"] == ("gloo" if mode in GLOO_RUNS else "shared_memory")
    packed = runs[mode]["packed_passes"]  # every rank the same count (the choice is a collective)
    assert len(set(packed)) == 1 and (packed[0] == 0) == (mode in UNPACKED_RUNS), packed
    # the step gathered a block at a time (and the prefetched next one), never the whole model
    assert runs[mode]["blocks"] == 4 and runs[mode]["most_gathered_blocks"] <= 2
    assert runs[mode]["offloaded"] == (mode in CHECKPOINTED)  # rollout.learner_offload cpu: CPUOffloadPolicy
    if not spec.lora.enabled:  # the KL reference (kl_loss_coef 0.01): a sharded copy, 1/ranks of it per rank
        assert runs[mode]["reference_numel"] == [whole] * ranks
        assert max(runs[mode]["reference_local_numel"]) <= whole / ranks + 1000  # a row of padding at most


def test_four_ranks_ran_uneven_micro_batch_counts_and_resume_on_two(four_ranks, two_ranks):
    results = four_ranks[0]
    for mode in FOUR_RANK_RUNS:
        if mode in CHECKPOINTED:  # 16-token micro-batches: padding passes were needed
            assert len(set(results[mode]["passes"])) > 1, results[mode]["passes"]
        checkpoint = results[mode]["checkpoint"]
        assert {f"__{rank}_0.distcp" for rank in range(4)} <= set(checkpoint["files"])
        # the second step on two ranks from the four ranks' checkpoint is the four ranks' second step
        after_one, expected = results[mode]["step1"], results[mode]["step2"]
        assert relative_update_error(after_one, expected, two_ranks[f"{RESUMED}{mode}"]["step2"]) <= 1e-5


@pytest.mark.parametrize("mode", MODES)
def test_a_two_rank_checkpoint_resumes_on_one_rank(two_ranks, one_rank_group, tmp_path, mode):
    checkpoint = two_ranks[mode]["checkpoint"]
    assert checkpoint["format"] == "torch.distributed.checkpoint"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(checkpoint["files"])  # one shard file per rank
    worker = ShardedWorker(sharded_spec(tmp_path, mode).model_dump_json())
    worker.setup(0, 1, None, None)
    assert worker.load_state_dict(checkpoint) == 1
    after_one = worker.adapter_state()
    assert all(torch.equal(after_one[k], two_ranks[mode]["step1"][k]) for k in after_one)
    # the second update (Adam's moments, a refit reference) from the same state: one rank makes the two's
    worker.step(_samples())
    expected = two_ranks[mode]["step2"]
    assert relative_update_error(after_one, expected, worker.adapter_state()) <= 1e-5


def test_final_weights_are_written_in_peft_and_hugging_face_format(two_ranks, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    for mode in MODES:
        directory = tmp_path / mode
        for name, data in two_ranks[mode]["files"].items():
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_bytes(data)
        expected = two_ranks[mode]["step2"]
        if mode == "lora":
            base = load_causal_lm("openrft-demo", torch.device("cpu"), torch.float64)
            model = PeftModel.from_pretrained(base, str(directory))
            state = {k.replace(".default", ""): v for k, v in model.state_dict().items() if ".lora_" in k}
        else:
            state = AutoModelForCausalLM.from_pretrained(str(directory)).state_dict()
        assert set(expected) <= set(state)
        assert all(torch.equal(state[k], expected[k]) for k in expected)


def test_a_job_under_torchrun_trains_one_policy_on_two_ranks(tmp_path):
    import json

    import yaml

    recipe_path = small_recipe(tmp_path, max_steps=2, save_steps=1)
    recipe = yaml.safe_load(recipe_path.read_text())
    recipe["run"]["replicas"] = 2
    recipe["openrft"].update({"learner_sharding": "fsdp", "eval_at_start": False, "eval_max_examples": 4})
    recipe_path.write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    result = torchrun(["-m", "openrft", "train", str(recipe_path), "-o", str(run), "--quiet"])
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["steps"] == 2
    state = torch.load(run / "checkpoints" / "step-000002" / "trainer_state.pt", weights_only=False)["learner"]
    assert state["learners"] == 2 and state["version"] == 2
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(state["files"])  # both ranks' shards
    assert (run / "adapter" / "adapter_model.safetensors").exists()  # the gathered LoRA adapter, PEFT format
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "actor/grad_norm" in r] == [1, 2]
