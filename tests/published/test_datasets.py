"""Every dataset shape of the corpus loads as its source describes it, and loads the same when an editor or
export tool rewrote it (a byte-order mark and CRLF, UTF-16, gzip)."""

from __future__ import annotations

import codecs
import gzip

import pytest

from openrft.data.loader import load_dataset
from tests.published.datasets import DATASETS

EXPORTS = {
    "as published": lambda text: text.encode(),
    "BOM and CRLF": lambda text: codecs.BOM_UTF8 + text.replace("\n", "\r\n").encode(),
    "UTF-16": lambda text: text.encode("utf-16"),
    "gzip, trailing blank lines": lambda text: gzip.compress((text + "\n\n").encode()),
}


@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize("dataset", DATASETS, ids=[d.file for d in DATASETS])
def test_a_published_dataset_loads_as_its_source_describes(dataset, export, tmp_path):
    path = tmp_path / dataset.file
    path.write_bytes(EXPORTS[export](dataset.path.read_text(encoding="utf-8")))
    examples = load_dataset(str(path), require_reference=True)
    assert [e.reference_answer for e in examples] == dataset.references
    assert [[m["role"] for m in e.messages] for e in examples] == dataset.roles
