"""Fixtures of the monitoring tests: demo recipes with run-level settings, real servers on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import small_recipe


def recipe_with(tmp_path: Path, run: dict | None = None, trainer: dict | None = None, **top) -> Path:
    """The tests' small Nova recipe for the demo model, with ``run:`` fields (and top-level blocks) changed."""
    path = small_recipe(tmp_path, **(trainer or {}))
    recipe = yaml.safe_load(path.read_text())
    recipe["run"].update(run or {})
    for key, value in top.items():
        recipe[key] = {**recipe.get(key, {}), **value}
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def demo_recipe(tmp_path):
    return lambda **kw: recipe_with(tmp_path, **kw)
