"""The corpus of published dataset shapes (files in datasets/): what each holds once loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class PublishedDataset:
    file: str
    source: str
    references: list[Any]  # each line's reference answer, as loaded
    roles: list[list[str]]  # each line's message roles, as loaded

    @property
    def path(self) -> Path:
        return HERE / "datasets" / self.file


DATASETS = [
    PublishedDataset(
        "nova_rft_lines.jsonl",
        "the Nova RFT user guide's dataset format (id, messages, reference_answer, extra fields, tools), and "
        "github.com/aws-samples/amazon-bedrock-samples rm-example-data/gms8k (reference_answer.final_answer)",
        [{"solution": "x = 5"}, {"final_answer": "72"}, 49],
        [["system", "user"], ["system", "user"], ["user"]],
    ),
    PublishedDataset(
        "openai_rft_items.jsonl",
        "platform.openai.com/docs/guides/reinforcement-fine-tuning (messages plus any item fields; the graders "
        "guide's item namespace)",
        [True, 0.75, ["red", "green", "blue"], "Jupiter"],
        [["user"]] * 4,
    ),
    PublishedDataset(
        "vertex_examples.jsonl",
        "cloud.google.com Vertex AI reinforcement tuning dataset format (systemInstruction, contents, references), "
        "with the proto field name system_instruction",
        [{"ground_truth_answer": "391"}, {"ground_truth_answer": "42"}],
        [["system", "user"], ["system", "user", "assistant", "user"]],
    ),
]
