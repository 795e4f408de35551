#!/usr/bin/env bash
# `make test-vllm`: a vLLM server for the demo model, the tests in tests/vllm against it, the server stopped
# whatever happens. The tests start a second server of their own where they need to kill one.
set -euo pipefail
cd "$(dirname "$0")/.."
export VLLM_STATE_DIR="${VLLM_STATE_DIR:-runs/vllm-test-server}"
trap 'bash scripts/vllm_server.sh stop' EXIT
started=$SECONDS
url="$(bash scripts/vllm_server.sh start)"
echo "vLLM server at $url (started in $((SECONDS - started)) s)"
OPENRFT_VLLM_URL="$url" OPENRFT_VLLM_TESTS=1 "${VENV:-.venv}/bin/pytest" tests/vllm -q -p no:cacheprovider "$@"
