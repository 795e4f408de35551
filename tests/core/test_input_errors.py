"""Bad recipes fail before training, naming the YAML path, the value and what is allowed."""

import pytest
import yaml

from openrft.cli import main
from openrft.spec import SpecError
from openrft.spec.dialects import load_job


def _edit(path, mutate):
    recipe = yaml.safe_load(path.read_text())
    mutate(recipe)
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_small_recipe_resolves(recipe_factory):
    spec = load_job(recipe_factory())
    assert spec.dialect == "nova"
    assert spec.training.prompts_per_step == 4  # global_batch_size 16 samples / 4 per prompt
    assert spec.sampling.samples_per_prompt == 4
    assert spec.algorithm.clip_ratio_high == 0.2
    assert spec.reward.function.name == "exact_match"


def test_negative_clip_ratio_names_the_yaml_path(recipe_factory):
    path = recipe_factory(clip_ratio_high=-1)
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert "training_config.trainer.clip_ratio_high: -1 must be >= 0" in str(info.value)


def test_every_problem_reported_together(recipe_factory):
    def mutate(r):
        r["training_config"]["global_batch_size"] = 300
        r["training_config"]["trainer"]["optim_config"]["weight_decay"] = 2
        r["training_config"]["trainer"]["bogus"] = 1

    path = _edit(recipe_factory(), mutate)
    with pytest.raises(SpecError) as info:
        load_job(path)
    text = str(info.value)
    assert "training_config.global_batch_size: 300 is outside [16, 256]" in text
    assert "training_config.trainer.optim_config.weight_decay: 2 is outside [0, 1]" in text
    assert "training_config.trainer.bogus: is not a known field" in text
    assert len(info.value.problems) == 3


def test_missing_model_path_names_the_field(recipe_factory, tmp_path):
    path = _edit(recipe_factory(), lambda r: r["run"].update(model_name_or_path=str(tmp_path / "no-model")))
    with pytest.raises(SpecError, match=r"run.model_name_or_path: '.*no-model' is not an existing model directory"):
        load_job(path)


def test_cli_reports_bad_dataset_lines_before_training(recipe_factory, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reference_answer": "1"}\n{oops\n')
    path = _edit(recipe_factory(), lambda r: r["run"].update(data_s3_path=str(bad)))
    code = main(["train", str(path), "--output", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{bad}:1: messages: is required" in err
    assert f"{bad}:2: <line>: is not valid JSON" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_cli_reports_recipe_errors(recipe_factory, tmp_path, capsys):
    code = main(["train", str(recipe_factory(clip_ratio_high=-1)), "--output", str(tmp_path / "run")])
    assert code == 2
    assert "clip_ratio_high: -1 must be >= 0" in capsys.readouterr().err
