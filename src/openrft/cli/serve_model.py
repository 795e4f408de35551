"""``openrft serve-model MODEL``: an OpenAI-compatible generation server with vLLM's LoRA adapter routes."""

from __future__ import annotations

import argparse
import os

from openrft.errors import OpenRFTError
from openrft.rollout.server_guard import ServeLimits, is_loopback

API_KEY_ENV = "OPENRFT_SERVE_MODEL_API_KEY"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve-model", help="serve a model (and LoRA adapters) over an OpenAI-compatible API")
    p.add_argument("model", help="model name or path (openrft-demo, a directory, a Hugging Face id)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="serve the PEFT adapter at PATH under NAME (repeatable), e.g. tuned=runs/demo/adapter",
    )
    p.add_argument("--served-model-name", help="the base model's name in the API (default: MODEL)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-new-tokens", type=int, default=512, help="chat completions' default max_tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling stream of requests without a seed")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: one per physical core)")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"clients must send Authorization: Bearer KEY (default ${API_KEY_ENV}); required off loopback",
    )
    p.add_argument(
        "--allow-load-from",
        action="append",
        default=[],
        metavar="DIR",
        help="POST /v1/load_weights and /v1/load_lora_adapter read only under DIR (repeatable; symlinks are "
        "resolved first); without it, loading over the API is refused",
    )
    p.add_argument("--max-samples-per-request", type=int, default=ServeLimits.max_samples, help="prompts × n")
    p.add_argument(
        "--max-tokens-per-request",
        type=int,
        default=ServeLimits.max_tokens,
        help="prompt tokens + samples × max_tokens",
    )
    p.set_defaults(handler=run)


def parse_adapters(values: list[str]) -> dict[str, str]:
    adapters: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise OpenRFTError(f"--adapter {value!r}: expected NAME=PATH, e.g. tuned=runs/demo/adapter")
        if name in adapters:
            raise OpenRFTError(f"--adapter {value!r}: the name {name!r} is given twice")
        adapters[name] = path
    return adapters


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from openrft.rollout.server import ApiError, build_app, load_server

    adapters = parse_adapters(args.adapter)
    if not args.api_key and not is_loopback(args.host):
        raise OpenRFTError(
            f"--host {args.host} serves the model to the network: give --api-key (or ${API_KEY_ENV}) so that "
            "only clients holding it can generate and load weights"
        )
    for value, flag in ((args.max_samples_per_request, "samples"), (args.max_tokens_per_request, "tokens")):
        if value < 1:
            raise OpenRFTError(f"--max-{flag}-per-request {value}: must be at least 1")
    limits = ServeLimits(
        max_samples=args.max_samples_per_request,
        max_tokens=args.max_tokens_per_request,
        load_roots=tuple(args.allow_load_from),
    )
    try:
        server = load_server(
            args.model,
            served_name=args.served_model_name,
            adapters=adapters,
            device=args.device,
            dtype=args.dtype,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            threads=args.threads,
            limits=limits,
        )
    except ApiError as exc:
        raise OpenRFTError(f"--adapter: {exc.message}") from None
    print(
        f"serving {server.served_name} with adapters {sorted(server.adapters) or 'none'} "
        f"at http://{args.host}:{args.port}/v1",
        flush=True,
    )
    uvicorn.run(build_app(server, args.api_key), host=args.host, port=args.port, log_level="warning")
    return 0
