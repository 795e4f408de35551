"""The repository's documents point only at files it has, and docs/design.md maps every package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(
    r"(?<![\w/.-])((?:docs|benchmarks|examples|scripts)/[\w./-]*\w\.(?:md|py|yaml|json|png)\b|[A-Z][A-Z_]+\.md)"
)
TEXT = ("*.py", "*.md", "*.yaml", "*.yml", "*.toml")


def _texts() -> list[Path]:
    roots = [ROOT / name for name in ("src", "docs", "tests", "examples", "benchmarks", "scripts")]
    files = [ROOT / "README.md", ROOT / "Makefile"]
    for root in roots:
        files += [p for pattern in TEXT for p in root.rglob(pattern) if ".venv" not in p.parts]
    return [f for f in files if f != Path(__file__).resolve()]  # this file names missing ones on purpose


def cited_missing(files: list[Path]) -> list[str]:
    """``file name: cited`` for every document path a file cites that the repository does not have."""
    missing = []
    for path in files:
        for cited in set(CITED.findall(path.read_text(encoding="utf-8", errors="replace"))):
            if not (ROOT / cited).exists() and not list(ROOT.glob(f"*/{cited}")):
                missing.append(f"{path.name}: {cited}")
    return sorted(missing)


def test_documents_cite_only_files_the_repository_has(tmp_path):
    assert cited_missing(_texts()) == []
    stray = tmp_path / "stray.md"
    outside = "SERVICES" + ".md"  # spelled apart so that the repository itself never names a missing file
    stray.write_text(f"as {outside} says; see docs/nowhere.md and docs/design.md")
    found = cited_missing([stray])
    assert [m.split(": ", 1)[1] for m in found] == [outside, "docs/nowhere.md"]


def test_design_names_every_package():
    """Every package and top-level module of ``src/openrft`` appears in docs/design.md as `name`, `name/` or
    `name.py` (the packages table)."""
    named = set(re.findall(r"`([^`/]+)/?`", (ROOT / "docs" / "design.md").read_text(encoding="utf-8")))
    source = ROOT / "src" / "openrft"
    parts = [p.name for p in source.iterdir() if p.name != "__init__.py" and not p.name.startswith((".", "__pycache"))]
    assert [p for p in parts if p not in named and p.removesuffix(".py") not in named] == []
