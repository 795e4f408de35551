#!/usr/bin/env bash
# OpenRFT on one NVIDIA GPU, in one command of at most 8 minutes (issue 50, point 3). Run from anywhere:
#
#   bash scripts/gpu_check.sh [--out DIR] [--budget SECONDS]     on the GPU machine (python3 with CUDA torch)
#   bash scripts/gpu_check.sh --dry-run [--out DIR]               the same steps on the CPU, tiny, in about a minute
#
# On the GPU machine, which has no network, the wheels of scripts/gpu_wheels.sh (.whl/, carried there) are first
# installed into --site (default /tmp/site); PYTHONPATH is then src/, the repo root, that folder: the working
# tree's code runs, the machine's own torch, transformers and peft are used. Each step below is bounded by
# `timeout` and by what is left of --budget (default 465 s; 150 s with --dry-run); a step that fails or runs out
# of time is recorded and the next one runs. The exit status is 0 only if every step passed.
#
# Steps, and the files they write into --out (default $OUT if set, else runs/gpu_check; flat, at most 8 files):
#   env           env.txt             nvidia-smi, python, torch and CUDA versions, the GPU, where each package is
#                                     imported from, every openrft module imported (optional extras apart), pip check
#   tests         tests.txt           pytest -m cuda on the tests marked cuda (tests/core/test_cuda.py), -rA
#   demo          demo_metrics.jsonl  the demo job (examples/arithmetic/recipe.yaml) with openrft.device cuda, 20
#                 demo.log            steps (cpu, 2 steps, 16 validation examples with --dry-run): its metrics.jsonl;
#                                     the log holds its output, its summary.json and the device it ran on
#   bench-0.5b    bench.jsonl         python -m benchmarks gpu --shape 0.5b, then 1.5b: one JSON line each
#   bench-1.5b    bench.log           (--allow-cpu --tiny with --dry-run); the log holds their output
#   sync-probe    summary.json        every step's status, exit code, seconds and limit, the sync probe's note
#                                     (issue 50 point 1), the command, python and PYTHONPATH
#
# Options: --python PY (default $PYTHON, else .venv/bin/python with --dry-run when it exists, else python3),
# --site DIR, --wheels (install .whl also with --dry-run), --no-wheels.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
COMMAND="bash scripts/gpu_check.sh $*"

DRY=0
OUT_DIR=${OUT:-runs/gpu_check}
BUDGET=
SITE=/tmp/site
WHEELS=
PY=${PYTHON:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --out) OUT_DIR=$2; shift ;;
        --budget) BUDGET=$2; shift ;;
        --site) SITE=$2; shift ;;
        --python) PY=$2; shift ;;
        --wheels) WHEELS=1 ;;
        --no-wheels) WHEELS=0 ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$PY" ]; then
    if [ "$DRY" = 1 ] && [ -x .venv/bin/python ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
fi
[ -n "$BUDGET" ] || BUDGET=$([ "$DRY" = 1 ] && echo 150 || echo 465)
[ -n "$WHEELS" ] || WHEELS=$([ "$DRY" = 1 ] && echo 0 || echo 1)
START=$SECONDS
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)

mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || { echo "cannot write to $OUT_DIR" >&2; exit 2; }
FILES=(summary.json env.txt tests.txt demo_metrics.jsonl demo.log bench.jsonl bench.log)
for f in "${FILES[@]}"; do rm -f "$OUT_DIR/$f"; done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
: >"$WORK/steps.tsv"

export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
if [ "$DRY" = 1 ]; then DEVICE=cpu; else DEVICE=cuda; fi

# step NAME WANTED_SECONDS LOG COMMAND...: runs COMMAND under timeout (the smaller of WANTED_SECONDS and what is
# left of the budget), its output appended to LOG; records name, status, exit code, seconds, limit
step() {
    local name=$1 want=$2 log=$3
    shift 3
    local left=$((BUDGET - (SECONDS - START)))
    local limit=$((want < left ? want : left)) t0=$SECONDS rc status
    if [ "$limit" -lt 5 ]; then
        printf '%s\tskipped\t\t0\t%s\n' "$name" "$limit" >>"$WORK/steps.tsv"
        echo "== $name: skipped, the budget of ${BUDGET}s is spent" | tee -a "$log"
        return
    fi
    local shown="$*"
    shown=${shown//$'\n'/ }
    echo "== $name (at most ${limit}s): ${shown:0:300}" >>"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    if [ $rc = 0 ]; then status=ok; elif [ $rc = 124 ] || [ $rc = 137 ]; then status=timeout; else status=failed; fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$((SECONDS - t0))" "$limit" >>"$WORK/steps.tsv"
    echo "== $name: $status (exit $rc, $((SECONDS - t0)) s of at most $limit)" | tee -a "$log"
}

# the wheels: the project's own pure-Python dependencies, which the GPU machine lacks
WHEEL_NOTE="not installed (--dry-run or --no-wheels)"
if [ "$WHEELS" = 1 ]; then
    if compgen -G ".whl/*.whl" >/dev/null; then
        if timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .whl/*.whl >"$WORK/pip.log" 2>&1; then
            WHEEL_NOTE="$(ls .whl/*.whl | wc -l) wheels installed into $SITE (openrft wheel of $(cat .whl/COMMIT 2>/dev/null || echo '?'))"
        else
            WHEEL_NOTE="pip install of .whl failed: $(tail -3 "$WORK/pip.log" | tr '\n' ' ')"
        fi
    else
        WHEEL_NOTE="no .whl/*.whl here: run scripts/gpu_wheels.sh and carry .whl"
    fi
    export PYTHONPATH="$ROOT/src:$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "wheels: $WHEEL_NOTE"

# helpers, written where they do not travel back
cat >"$WORK/env.py" <<'EOF'
"""The environment: versions, the GPU, where packages come from, and every openrft module imported."""
import importlib
import pkgutil
import platform
import sys
import traceback
from importlib import metadata

print(f"python {sys.version.split()[0]} at {sys.executable}; {platform.platform()}")
import torch

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
print(f"cuda available: {torch.cuda.is_available()}, devices: {torch.cuda.device_count()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device 0: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, "
          f"{p.multi_processor_count} SMs, bf16 supported: {torch.cuda.is_bf16_supported()}")
names = ("torch transformers peft safetensors tokenizers huggingface-hub accelerate numpy pydantic pydantic-core "
         "typing-extensions fastapi starlette uvicorn sqlalchemy alembic omegaconf rapidfuzz nltk rouge-score wn "
         "sacrebleu regex httpx fsspec rich psutil pyyaml matplotlib tensorboard jinja2 pytest hypothesis openrft")
for name in names.split():
    try:
        dist = metadata.distribution(name)
        print(f"  {name} {dist.version}  ({dist.locate_file('')})")
    except metadata.PackageNotFoundError:
        print(f"  {name}: not installed")
import openrft

print(f"openrft imported from {openrft.__file__}")
OPTIONAL = {"ray", "tinker", "mcp", "mlflow", "boto3", "botocore", "vllm", "s3fs", "gcsfs", "psycopg", "wn"}
missing, optional = [], []
# __main__ runs the command line; alembic runs the migration scripts itself
SCRIPTS = ("openrft.__main__", "openrft.service.store.migrations.")
modules = [m.name for m in pkgutil.walk_packages(openrft.__path__, "openrft.") if not m.name.startswith(SCRIPTS)]
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as e:
        root = (getattr(e, "name", None) or "").split(".")[0]
        (optional if root in OPTIONAL else missing).append(f"{name}: {type(e).__name__}: {e}")
        if root not in OPTIONAL:
            traceback.print_exc(limit=3)
from openrft.cli import build_parser

build_parser()  # every subcommand's module
print(f"{len(modules)} openrft modules: {len(modules) - len(missing) - len(optional)} imported, "
      f"{len(optional)} need an optional extra, {len(missing)} failed")
for line in optional:
    print(f"  optional: {line}")
for line in missing:
    print(f"  FAILED: {line}")
sys.exit(1 if missing else 0)
EOF

cat >"$WORK/demo_recipe.py" <<'EOF'
"""The demo recipe with absolute data paths, no output location, the device set, and (dry run) a small evaluation."""
import sys
from pathlib import Path

import yaml

root, target, device, dry = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
source = root / "examples" / "arithmetic" / "recipe.yaml"
recipe = yaml.safe_load(source.read_text())
for key in ("data_s3_path", "validation_data_s3_path"):
    recipe["run"][key] = str((source.parent / recipe["run"][key]).resolve())
recipe["run"].pop("output_s3_path", None)
recipe.setdefault("openrft", {})["device"] = device
if dry:
    recipe["openrft"].update({"eval_max_examples": 16, "tensorboard": False})
target.write_text(yaml.safe_dump(recipe, sort_keys=False))
print(f"wrote {target}: the demo recipe on {device}")
EOF

cat >"$WORK/demo_report.py" <<'EOF'
"""What the demo run says about itself: its summary, the device it resolved, and its steps."""
import json
import sys
from pathlib import Path

run = Path(sys.argv[1])
summary = json.loads((run / "summary.json").read_text())
spec = json.loads((run / "spec.json").read_text())
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
print("summary.json:", json.dumps(summary, indent=1))
print("spec runtime:", json.dumps(spec.get("runtime")))
trained = [r for r in rows if "actor/pg_loss" in r]
print(f"metrics.jsonl: {len(rows)} lines, {len(trained)} training steps")
for r in trained:
    print(
        f"  step {r['step']}: reward {r.get('critic/rewards/mean', float('nan')):.3f}, "
        f"{r.get('perf/time_per_step', float('nan')):.3f} s, GPU peak {r.get('perf/max_memory_allocated_gb', 0):.2f} GB"
    )
sys.exit(0 if summary.get("status") == "succeeded" else 1)
EOF

cat >"$WORK/summary.py" <<'EOF'
"""summary.json from the steps' records."""
import json
import sys
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
meta = json.loads(sys.argv[3])
steps = []
for line in (work / "steps.tsv").read_text().splitlines():
    name, status, rc, seconds, limit = line.split("\t")
    steps.append(
        {"step": name, "status": status, "exit": int(rc) if rc else None, "seconds": int(seconds),
         "limit_s": int(limit)}
    )
for key in ("dry_run", "seconds", "budget_s"):
    if key in meta:
        meta[key] = int(meta[key])
meta["dry_run"] = bool(meta.get("dry_run"))
meta["steps"] = steps
meta["ok"] = all(s["status"] == "ok" for s in steps)
meta["files"] = sorted({p.name for p in out.iterdir() if p.is_file()} | {"summary.json"})
(out / "summary.json").write_text(json.dumps(meta, indent=1) + "\n")
EOF

# (a) the environment
step env 60 "$OUT_DIR/env.txt" bash -c '
    date -u; uname -a; echo "wheels: $1"
    if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "no nvidia-smi"; fi
    "$2" "$3"
    rc=$?
    echo "--- pip check"; "$2" -m pip check 2>&1 | head -40
    exit $rc' env "$WHEEL_NOTE" "$PY" "$WORK/env.py"

# (b) the tests marked cuda
mapfile -t CUDA_TESTS < <(grep -rlE --include='test_*.py' 'pytest\.mark\.cuda\b' tests | sort)
step tests $([ "$DRY" = 1 ] && echo 45 || echo 120) "$OUT_DIR/tests.txt" \
    "$PY" -m pytest -p no:cacheprovider -m cuda -rA -v --timeout 120 "${CUDA_TESTS[@]}"

# (d) the demo job on the device (before the benchmarks: it is the engine's own path end to end)
DEMO_STEPS=$([ "$DRY" = 1 ] && echo 2 || echo 20)
step demo $([ "$DRY" = 1 ] && echo 60 || echo 150) "$OUT_DIR/demo.log" bash -c '
    "$1" "$2" "$3" "$4/demo.yaml" "$5" "$6" || exit
    "$1" -m openrft train "$4/demo.yaml" --output "$4/demo" --steps "$7" --quiet
    rc=$?
    cp "$4/demo/metrics.jsonl" "$8/demo_metrics.jsonl" 2>/dev/null
    if [ -f "$4/demo/summary.json" ]; then "$1" "$4/demo_report.py" "$4/demo" || [ $rc != 0 ] || rc=1; fi
    exit $rc' demo "$PY" "$WORK/demo_recipe.py" "$ROOT" "$WORK" "$DEVICE" "$DRY" "$DEMO_STEPS" "$OUT_DIR"

# (c) the GPU benchmark at both shapes
if [ "$DRY" = 1 ]; then
    SIZE=(--allow-cpu --tiny --prompts 2 --samples 2 --prompt-tokens 6 --new-tokens 3 --steps 1)
else
    SIZE=()
fi
# a run that appended no line of its shape (no CUDA device: the benchmark says so and exits 0) has failed
BENCH='"$@" && grep -q "\"shape\": \"$0\"" "$OUT_DIR/bench.jsonl" 2>/dev/null || { echo "no result line"; exit 1; }'
export OUT_DIR
for shape in 0.5b 1.5b; do
    step "bench-$shape" $([ "$DRY" = 1 ] && echo 40 || ([ $shape = 0.5b ] && echo 120 || echo 170)) "$OUT_DIR/bench.log" \
        bash -c "$BENCH" "$shape" "$PY" -m benchmarks gpu --shape "$shape" --no-write --json "$OUT_DIR/bench.jsonl" \
        "${SIZE[@]}"
done

# (e) the sync probe (issue 50 point 1): its metric lands in the demo's metrics.jsonl once it exists
if grep -rqs "sync/max_logprob_diff" src/openrft; then
    if grep -qs "sync/max_logprob_diff" "$OUT_DIR/demo_metrics.jsonl"; then
        SYNC_NOTE="sync probe present: sync/max_logprob_diff is in demo_metrics.jsonl (one value a step)"
    else
        SYNC_NOTE="sync probe present in src/openrft, but the demo job's metrics.jsonl has no sync/max_logprob_diff"
    fi
else
    SYNC_NOTE="sync probe (issue 50 point 1) not built yet: nothing to run"
fi
echo "== sync-probe: $SYNC_NOTE"

META=$("$PY" -c 'import json, sys; print(json.dumps(dict(zip(sys.argv[1::2], sys.argv[2::2]))))' \
    command "$COMMAND" dry_run "$DRY" device "$DEVICE" started "$STARTED" finished "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    seconds "$((SECONDS - START))" budget_s "$BUDGET" python "$PY" pythonpath "$PYTHONPATH" wheels "$WHEEL_NOTE" \
    sync_probe "$SYNC_NOTE" 2>/dev/null) || META='{}'
"$PY" "$WORK/summary.py" "$WORK" "$OUT_DIR" "$META" 2>/dev/null || cp "$WORK/steps.tsv" "$OUT_DIR/summary.json"
echo "results in $OUT_DIR ($((SECONDS - START)) s):"
column -t -s $'\t' "$WORK/steps.tsv" 2>/dev/null || cat "$WORK/steps.tsv"
! grep -qv $'\tok\t' "$WORK/steps.tsv"
