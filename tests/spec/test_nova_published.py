"""Nova recipes and Bedrock requests in the shapes the services publish (fixtures in published/): read as
their launchers read them, every field accepted, cloud-only names mapped to local ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from openrft.cli import main
from openrft.spec.dialects import resolve_document, resolve_job
from openrft.spec.dialects.interpolation import drop_blanks, resolve_interpolation
from openrft.spec.dialects.nova import NovaRecipe
from openrft.spec.errors import SpecError

PUBLISHED = Path(__file__).parent / "published"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
ARN = "arn:aws:lambda:us-east-1:123456789012:function:shape-reward"
TRAINER = "training_config.trainer"
HANDLER = (
    "def lambda_handler(event, context):\n    return [{'id': s['id'], 'aggregate_reward_score': 0.0} for s in event]\n"
)


def published(name: str, tmp_path: Path, data: Path = EXAMPLES / "train.jsonl") -> Path:
    """The fixture with its dataset location (the only edit the tests make) pointing at ``data``."""
    text = (PUBLISHED / name).read_text().replace("DATA_PATH", str(data))
    path = tmp_path / name
    path.write_text(text.replace("OUTPUT_PATH", str(tmp_path / "out")))
    return path


def handler(tmp_path: Path) -> str:
    (tmp_path / "reward.py").write_text(HANDLER)
    return str(tmp_path / "reward.py") + ":lambda_handler"


def mapped(lambdas: dict[str, str] | None = None, **models: str) -> dict:
    return {"lambda_map": lambdas or {}, "model_map": models}


def test_interpolation_is_resolved_by_omegaconf_and_blanks_are_unset():
    raw = yaml.safe_load((PUBLISHED / "hyperpod_lora.yaml").read_text())
    resolved, problems = resolve_interpolation(raw)
    assert problems == []
    assert resolved["training_config"]["trainer"]["save_steps"] == 50
    assert resolved["training_config"]["rollout"]["rewards"]["api_endpoint"]["lambda_arn"] == ""
    clean = drop_blanks(resolved, NovaRecipe)
    assert "output_s3_path" not in clean["run"] and "reward_lambda_arn" not in clean["run"]
    assert "lambda_arn" not in clean["training_config"]["rollout"]["rewards"]["api_endpoint"]
    # null stays null where it means something: reasoning off, full-rank training
    assert drop_blanks({"training_config": {"reasoning_effort": None}}, NovaRecipe)["training_config"] == {
        "reasoning_effort": None
    }


def test_hyperpod_recipe_as_published_says_what_to_map(tmp_path):
    with pytest.raises(SpecError) as info:
        resolve_job(published("hyperpod_lora.yaml", tmp_path))
    found = [str(p) for p in info.value.problems]
    assert found == [
        "run.model_name_or_path: 'nova-lite-2/prod' is a model that runs only in its cloud service: map it to a "
        "local or Hugging Face model with --map-model 'nova-lite-2/prod=openrft-demo' (or openrft.model_map)",
        "training_config.rollout.rewards.api_endpoint.lambda_arn: is blank: the job names no reward Lambda; map it "
        "to a local handler or endpoint with --map-lambda 'reward.py:lambda_handler' (a file, or an http:// URL), "
        "or openrft.lambda_map",
    ]
    assert str(info.value).startswith(f"2 problem(s) in {tmp_path / 'hyperpod_lora.yaml'}:")


def test_hyperpod_recipe_resolves_field_by_field_with_the_mappings(tmp_path):
    target = handler(tmp_path)
    r = resolve_job(
        published("hyperpod_lora.yaml", tmp_path),
        mappings=mapped({"*": target}, **{"nova-lite-2/prod": "openrft-demo"}),
    )
    s = r.spec
    assert s.model.name_or_path == "openrft-demo" and s.metadata == {"model_type": "amazon.nova-2-lite-v1:0:256k"}
    assert (s.training.prompts_per_step, s.sampling.samples_per_prompt, s.training.total_steps) == (4, 4, 50)
    assert (s.checkpoint.interval, s.checkpoint.keep_top_k) == (50, 2)  # save_steps: ${...max_steps}
    assert (s.lora.enabled, s.lora.alpha, s.lora.lora_plus_lr_ratio) == (True, 32, 16.0)  # loraplus_lr_ratio
    assert (s.optimizer.lr, s.algorithm.ent_coeff, s.rollout.strategy) == (7e-5, 0.001, "off_policy_async")
    assert s.output_dir is None and s.tracking.mlflow_tracking_uri is None  # blank strings are unset
    assert s.reward.function.endpoint == target and s.reward.function.concurrency_limit == 4
    assert [str(w) for w in r.warnings] == [
        "run.rollout_worker_replicas: 1 is not used by OpenRFT (OpenRFT's rollout workers are run.generation_replicas)"
    ]


def test_smtj_template_spellings_resolve(tmp_path, data_dir):
    target = handler(tmp_path)
    path = published("smtj_model_peft.yaml", tmp_path, data_dir / "train.jsonl")
    r = resolve_job(path, mappings=mapped({ARN: target}, **{"amazon.nova-2-lite-v1:0:256k": "openrft-demo"}))
    s = r.spec
    # blank model_name_or_path: the model_type names the model
    assert s.model.name_or_path == "openrft-demo" and r.provenance["model.name_or_path"].field == "run.model_type"
    # max_epochs over 50 prompts (100 lines, 50 held out for validation), 8 prompts per step: ceil(2 * 50 / 8)
    assert (s.training.prompts_per_step, s.training.total_steps, s.training.epochs) == (8, 13, 2.0)
    assert (s.optimizer.lr, s.algorithm.ent_coeff, s.algorithm.kl_loss_coef) == (1e-4, 0.0, 0.001)
    assert (s.lora.enabled, s.lora.alpha, s.lora.lora_plus_lr_ratio, s.lora.dropout) == (True, 64, 8.0, 0.05)
    assert s.sampling.reasoning_effort is None and s.reward.function.endpoint == target
    assert r.provenance["reward.function"].note == f"{ARN!r} mapped by openrft.lambda_map"
    assert [str(w) for w in r.warnings] == [
        f"{TRAINER}.optim.min_lr: 0.0 is not used by OpenRFT (OpenRFT keeps the learning rate constant)",
        "training_config.rollout.generator.top_k: 1 makes sampling greedy: the 2 samples of a prompt are identical, "
        "so every group's rewards are equal and every advantage is 0 (nothing is learned); use top_k 0 (off) or a "
        "larger one, and a temperature above 0",  # the template's top_k: 1
    ]


def test_an_unmapped_lambda_arn_is_one_line_naming_what_to_map(tmp_path, data_dir, capsys):
    path = published("smtj_model_peft.yaml", tmp_path, data_dir / "train.jsonl")
    model = ["--map-model", "amazon.nova-2-lite-v1:0:256k=openrft-demo"]
    problem = (
        f"training_config.rollout.rewards.api_endpoint.lambda_arn: '{ARN}' is an AWS Lambda, and no "
        f"AWS credentials are configured to invoke it: map it to a local handler or endpoint with --map-lambda "
        f"'{ARN}=reward.py:lambda_handler' (a file, or an http:// URL), or openrft.lambda_map"
    )
    assert main(["train", str(path), *model, "--output", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}: {problem}", err
    assert main(["spec", "validate", str(path), *model]) == 0  # valid as written: the ARN is to map
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [f"  - {problem}", f"to train here: openrft train {path} --map-lambda '{ARN}=HANDLER'"]


def test_a_mapped_handler_file_must_exist(tmp_path, data_dir):
    path = published("smtj_model_peft.yaml", tmp_path, data_dir / "train.jsonl")
    with pytest.raises(SpecError, match=r"lambda_arn: .* maps to '.*missing.py:lambda_handler', but that file"):
        resolve_job(path, mappings=mapped({ARN: str(tmp_path / "missing.py:lambda_handler")}))


def test_no_peft_block_or_a_null_scheme_is_full_rank_and_explain_says_so(tmp_path, capsys):
    target = handler(tmp_path)
    path = published("smtj_full_rank.yaml", tmp_path)
    r = resolve_job(path, mappings=mapped({"*": target}, **{"nova-lite-2/prod": "openrft-demo"}))
    assert r.spec.lora.enabled is False and r.provenance["lora.enabled"].note == "peft_scheme null: full-rank training"
    text = path.read_text()
    path.write_text(text[: text.index("    peft:")])  # no peft block at all
    r = resolve_job(path, mappings=mapped({"*": target}, **{"nova-lite-2/prod": "openrft-demo"}))
    assert r.spec.lora.enabled is False
    assert (
        main(["spec", "explain", str(path), "--map-lambda", target, "--map-model", "nova-lite-2/prod=openrft-demo"])
        == 0
    )
    out = capsys.readouterr().out
    assert "lora.enabled = false" in out and "no peft block: full-rank training (all weights), as on the service" in out


def _recipe(trainer: dict | None = None, **tc) -> dict:
    return {
        "run": {"model_name_or_path": "openrft-demo", "data_s3_path": "train.jsonl"},
        "training_config": {
            "rollout": {"rewards": {"preset_reward_function": "exact_match"}},
            "trainer": {"max_steps": 2, **(trainer or {})},
            **tc,
        },
    }


def resolve(doc):
    return resolve_document(doc, base_dir=Path("/jobs"), dataset_size=lambda location: 100)


@pytest.mark.parametrize("size", [16, 48, 100, 256])
def test_any_global_batch_size_hyperpod_documents(size):
    doc = _recipe(
        global_batch_size=size,
        rollout={"advantage_strategy": {"number_generation": 2}, "rewards": {"preset_reward_function": "exact_match"}},
    )
    assert resolve(doc).spec.samples_per_step == size


def test_save_steps_zero_saves_only_at_the_end_and_task_type_is_a_warning():
    r = resolve(_recipe({"save_steps": 0}, task_type="omega_rl_train"))
    assert r.spec.checkpoint.interval == 0
    assert [str(w) for w in r.warnings] == [
        "training_config.task_type: 'omega_rl_train' is not used by OpenRFT (the launcher's task name; OpenRFT runs "
        "RFT training)"
    ]


def test_two_spellings_of_one_field_must_agree():
    doc = _recipe(
        {
            "ent_coeff": 0.1,
            "entropy_coeff": 0.2,
            "peft": {"lora_tuning": {"lora_plus_lr_ratio": 4, "loraplus_lr_ratio": 8}},
        }
    )
    with pytest.raises(SpecError) as info:
        resolve(doc)
    assert [str(p) for p in info.value.problems] == [
        f"{TRAINER}.peft.lora_tuning.loraplus_lr_ratio: 8.0 is also given as "
        f"{TRAINER}.peft.lora_tuning.lora_plus_lr_ratio: write it in one place",
        f"{TRAINER}.entropy_coeff: 0.2 is also given as {TRAINER}.ent_coeff: write it in one place",
    ]
    same = _recipe({"ent_coeff": 0.1, "entropy_coeff": 0.1})
    assert resolve(same).spec.algorithm.ent_coeff == 0.1


def test_every_problem_at_once_interpolation_included():
    doc = _recipe(
        {"save_steps": "${oc.select:training_config.trainer.nowhere}", "test_steps": "${training_config.nope}"}
    )
    doc["training_config"]["global_batch_size"] = 300
    doc["training_config"]["trainer"]["optim_config"] = {"lr": -1}
    with pytest.raises(SpecError) as info:
        resolve(doc)
    found = [str(p) for p in info.value.problems]
    assert [p.split(":")[0] for p in found] == [
        f"{TRAINER}.test_steps",
        "training_config.global_batch_size",
        f"{TRAINER}.optim_config.lr",
    ], found
    assert "cannot be resolved" in found[0]
    # oc.select of a missing key is null: the default applies
    del doc["training_config"]["trainer"]["test_steps"]
    del doc["training_config"]["global_batch_size"]
    del doc["training_config"]["trainer"]["optim_config"]
    assert resolve(doc).spec.checkpoint.interval == 5


def test_max_steps_or_max_epochs_is_required():
    doc = _recipe()
    del doc["training_config"]["trainer"]["max_steps"]
    with pytest.raises(
        SpecError, match=r"training_config.trainer.max_steps: is required \(or training_config.max_epochs\)"
    ):
        resolve(doc)


def test_bedrock_create_model_customization_job_request(tmp_path, data_dir):
    path = published("bedrock_create_job.json", tmp_path, data_dir / "train.jsonl")
    with pytest.raises(SpecError) as info:
        resolve_job(path)
    assert [p.path for p in info.value.problems] == [
        "baseModelIdentifier",
        "customizationConfig.rftConfig.graderConfig.lambdaGrader.lambdaArn",
    ]
    target = handler(tmp_path)
    grader = "arn:aws:lambda:us-east-1:123456789012:function:shape-grader"
    base = "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-2-lite-v1:0:256k"
    r = resolve_job(path, mappings=mapped({grader: target}, **{base: "openrft-demo"}))
    s = r.spec
    # batchSize 16 / 4 samples = 4 prompts per step; ceil(1 epoch * 50 prompts / 4) = 13 steps
    assert (s.training.prompts_per_step, s.training.total_steps, s.optimizer.lr) == (4, 13, 1e-4)
    assert (s.sampling.max_length, s.sampling.reasoning_effort, s.evaluation.interval) == (136, "low", 10)
    assert s.reward.function.endpoint == target and s.model.name_or_path == "openrft-demo"


def test_bedrock_openai_compatible_job_with_a_lambda_grader(tmp_path, data_dir):
    arn = "arn:aws:lambda:us-west-2:123456789012:function:my-reward-function"
    job = {
        "model": "openai.gpt-oss-20b-1:0",
        "training_file": str(data_dir / "train.jsonl"),
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": {"type": "lambda", "lambda": {"function": arn}},
                "hyperparameters": {"n_epochs": 1, "batch_size": 4, "learning_rate_multiplier": 1.0},
            },
        },
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    with pytest.raises(SpecError) as info:
        resolve_job(path)
    assert [p.path for p in info.value.problems] == ["model", "method.reinforcement.grader.lambda.function"]
    target = handler(tmp_path)
    r = resolve_job(path, mappings=mapped({arn: target}, **{"openai.gpt-oss-20b-1:0": "openrft-demo"}))
    assert r.spec.reward.function.type == "nova_lambda" and r.spec.reward.function.endpoint == target
    assert r.spec.dialect == "openai" and r.spec.model.name_or_path == "openrft-demo"


def test_lora_settings_under_full_rank_are_named_as_ignored():
    doc = _recipe()
    doc["openrft"] = {"lora_rank": 8}
    r = resolve(doc)
    assert r.spec.lora.enabled is False
    assert [(w.path, w.value) for w in r.warnings] == [("openrft.lora_rank", 8)]
    assert "full rank" in str(r.warnings[0])
    doc["training_config"]["trainer"]["peft"] = {"peft_scheme": "lora"}
    assert resolve(doc).warnings == []


def test_a_handler_file_is_named_by_a_mapping_not_in_the_arn_field(tmp_path):
    target = handler(tmp_path)
    doc = _recipe()
    doc["training_config"]["rollout"]["rewards"] = {"api_endpoint": {"lambda_arn": target}}
    with pytest.raises(SpecError, match=r"is a handler file: name it in openrft\.lambda_map"):
        resolve(doc)
    doc["openrft"] = {"lambda_map": {"*": target}}
    doc["training_config"]["rollout"]["rewards"] = {"api_endpoint": {"lambda_concurrency_limit": 2}}
    assert resolve(doc).spec.reward.function.endpoint == target


def test_map_lambda_with_an_arn_needs_a_target(tmp_path, capsys):
    assert main(["spec", "validate", str(tmp_path / "x.yaml"), "--map-lambda", ARN]) == 2
    assert f"--map-lambda {ARN}: write ARN=TARGET" in capsys.readouterr().err


def test_a_missing_training_dataset_is_reported_with_the_other_problems():
    doc = _recipe()
    del doc["run"]["data_s3_path"]
    doc["training_config"]["trainer"]["kl_loss_coef"] = "lots"
    with pytest.raises(SpecError) as info:
        resolve(doc)
    paths = [p.path for p in info.value.problems]
    assert "run.data_s3_path" in paths and "training_config.trainer.kl_loss_coef" in paths
