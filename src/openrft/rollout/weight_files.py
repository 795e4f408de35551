"""Full weights as files a generation engine reloads in place (``openrft serve-model``'s ``POST
/v1/load_weights``, vLLM's ``reload_weights``), written and read a block at a time.

The files are a Hugging Face sharded checkpoint: one safetensors file per decoder block (``...layers.N.``)
and one for the rest (embeddings, final norm, LM head), with ``model.safetensors.index.json`` naming each
tensor's file, which vLLM's loader reads as it reads any sharded checkpoint. Writing serializes one
block's tensors at a time and reading (``iter_weight_files``) opens one tensor at a time, so neither side
holds a second copy of the whole model beside the one it is given or loads into.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

INDEX = "model.safetensors.index.json"
_BLOCK = re.compile(r"^(.*?\blayers\.\d+)\.")


def block_of(name: str) -> str:
    """The decoder block a tensor belongs to (``model.layers.3``), or ``""`` for the rest of the model."""
    match = _BLOCK.match(name)
    return match.group(1) if match else ""


def write_weight_files(weights: Mapping[str, torch.Tensor], directory: Path) -> list[Path]:
    """``weights`` as one safetensors file per block in ``directory`` (made if missing), with the index;
    the files, in order. Each block's tensors are copied out (tied tensors become separate ones), written
    and dropped before the next block."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[str]] = {}
    for name in weights:
        groups.setdefault(block_of(name), []).append(name)
    files, weight_map, total = [], {}, 0
    for number, names in enumerate(groups.values(), start=1):
        file = directory / f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: weights[name].detach().to("cpu").contiguous().clone() for name in names}
        save_file(tensors, str(file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(names, file.name))
        files.append(file)
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX).write_text(json.dumps(index, indent=1))
    return files


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a weights directory, in name order (none when it is not a directory)."""
    return sorted(directory.glob("*.safetensors")) if directory.is_dir() else []


def weight_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, read from the files' headers (no tensor data)."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def iter_weight_files(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of the files, read one at a time."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118
                yield name, handle.get_tensor(name)
