"""Dialects are a registry (``spec.dialects.registry``): each module registers how it detects and resolves its
documents and where they name what the service reads. Nothing else picks behaviour by a dialect's name, so a new
dialect is its module, its tests and, with a route shape of its own, one route module."""

from __future__ import annotations

import re
from pathlib import Path

from openrft.spec.dialects import detect_dialect, registry

SRC = Path(__file__).resolve().parents[2] / "src" / "openrft"
NAMES = "nova|vertex|openai|canonical|mtrl|bedrock"
COMPARISON = re.compile(rf"""(==|!=)\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)|in \(["']({NAMES})["']""")
# Modules that name a dialect, each for a reason that is not choosing how a document is read.
ALLOWED = {
    "client.py": "the SDK's call per route (a dialect's documents go to that dialect's route)",
    "service/views.py": "each route's response shape (job.api is the route that created the job)",
}


def test_no_module_outside_the_dialects_compares_dialect_names():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative.startswith("spec/dialects/") or relative.startswith("service/routes_") or relative in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARISON.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == [], "ask openrft.spec.dialects.registry instead:\n" + "\n".join(found)


def test_the_mtrl_dialect_lives_in_the_dialects_package_alone():
    """The newest dialect (Nova's MTRL recipes) needed its module, its tests and the Nova entry's resolver: no
    module outside ``spec/dialects`` imports it."""
    importing = re.compile(r"dialects\.mtrl|dialects import .*\bmtrl\b")
    outside = [
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if not path.relative_to(SRC).as_posix().startswith("spec/dialects/") and importing.search(path.read_text())
    ]
    assert outside == []


def test_every_service_dialect_says_where_its_documents_name_things():
    assert registry.service_dialects() == ("nova", "vertex", "openai")
    assert registry.names()[-1] == "canonical"  # tried last: any document with training, model and reward
    for name in registry.service_dialects():
        fields = registry.fields(name)
        assert all((fields.train, fields.validation, fields.model, fields.reward, fields.output, fields.replicas))
    assert registry.fields("openai").resolves_file_ids and not registry.fields("vertex").resolves_file_ids
    assert detect_dialect({"run": {}, "rl": {"loss_fn": "ppo"}}) == "nova"  # an MTRL recipe: Nova's resolver
    assert detect_dialect({"reinforcementTuningSpec": {}}) == "vertex"
    assert detect_dialect({"training_file": "f", "model": "m"}) == "openai"
