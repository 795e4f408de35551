"""``openrft serve-model MODEL``: an OpenAI-compatible generation server with vLLM's LoRA adapter routes."""

from __future__ import annotations

import argparse

from openrft.errors import OpenRFTError


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
        )
    except ApiError as exc:
        raise OpenRFTError(f"--adapter: {exc.message}") from None
    print(
        f"serving {server.served_name} with adapters {sorted(server.adapters) or 'none'} "
        f"at http://{args.host}:{args.port}/v1",
        flush=True,
    )
    uvicorn.run(build_app(server), host=args.host, port=args.port, log_level="warning")
    return 0
