"""The files of ``src/openrft`` a grader passes through from the ``graders/run`` route to its score.

    python scripts/grader_walk.py [--json]

Runs ``service.graders.run`` (what the route ``POST /v1/fine_tuning/alpha/graders/run`` hands to the
grader pool; ``routes_openai.py`` and ``work_pool.py`` are counted on top) for a few graders, as the
operator, and lists every file under ``src/openrft`` whose Python code ran, in the order first entered.
A measure of how much a reader has to open to follow one request (docs/design.md, "A grader from the
API to its score").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src" / "openrft"
ROUTE_FILES = ["service/routes_openai.py", "service/work_pool.py"]  # the route and the pool it hands to

ITEM = {"reference_answer": "42", "messages": [{"role": "user", "content": "6 * 7?"}]}
GRADERS = {
    "string_check": {
        "type": "string_check",
        "name": "exact",
        "input": "{{sample.output_text}}",
        "reference": "{{item.reference_answer}}",
        "operation": "eq",
    },
    "text_similarity": {
        "type": "text_similarity",
        "input": "{{sample.output_text}}",
        "reference": "{{item.reference_answer}}",
        "evaluation_metric": "fuzzy_match",
    },
}
GRADERS["multi"] = {
    "type": "multi",
    "graders": {"exact": GRADERS["string_check"], "close": GRADERS["text_similarity"]},
    "calculate_output": "0.5 * exact + 0.5 * close",
}


def walk(grader: dict) -> tuple[list[str], float]:
    from openrft.service import graders

    visited: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(SOURCE):
                name = str(path.relative_to(SOURCE))
                if name not in visited:
                    visited.append(name)

    sys.setprofile(profile)
    try:
        answer = graders.run(grader, "42", ITEM, None, None)
    finally:
        sys.setprofile(None)
    return ROUTE_FILES + [v for v in visited if v not in ROUTE_FILES], answer["reward"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import openrft.service.graders  # noqa: F401  (imports are not part of the walk)

    results = {}
    for name, grader in GRADERS.items():
        walk(grader)  # the first call imports what the kind imports lazily
        files, reward = walk(grader)
        results[name] = {"files": len(files), "reward": reward, "visited": files}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, result in results.items():
        print(f"{name}: {result['files']} files (reward {result['reward']:.3g})")
        for path in result["visited"]:
            print(f"  {path}")


if __name__ == "__main__":
    main()
