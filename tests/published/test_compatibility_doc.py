"""docs/compatibility.md's table of published job kinds: one row per dialect of the corpus, each command one
that ``openrft`` parses (an option renamed in the CLI and not in the page fails here)."""

from __future__ import annotations

import re
import shlex

from openrft.cli import build_parser
from tests.published.jobs import ROOT

PAGE = ROOT / "docs" / "compatibility.md"


def commands() -> dict[str, str]:
    section = PAGE.read_text().split("## Every published job kind, with its command", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| `([^`]+)`", section, flags=re.MULTILINE)
    return {kind: command for kind, command in rows if kind != "job kind"}


KINDS = ("Nova RFT recipe", "Nova samples template", "CreateModelCustomizationJob", "OpenAI-compatible", "Vertex")


def test_every_job_kind_of_the_corpus_has_a_row():
    kinds = " ".join(commands())
    for kind in (*KINDS, "OpenAI fine-tuning job"):
        assert kind in kinds, kind


def test_every_command_parses_with_its_mappings():
    parser = build_parser()
    for kind, command in commands().items():
        words = shlex.split(command)
        args = parser.parse_args(words[words.index("openrft") + 1 :])  # after any VARIABLE=value
        assert args.command == "train" and args.job and args.map_model and args.output, kind
