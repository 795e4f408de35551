"""``openrft eval``: score a model (optionally with an adapter) on a dataset with a reward."""

from __future__ import annotations

import argparse
import json

from openrft.errors import OpenRFTError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="score a model (and adapter) on a dataset with a job's reward")
    p.add_argument("--model", help="model name or path (default: the job's model)")
    p.add_argument("--adapter", help="a PEFT adapter directory, e.g. RUN_DIR/adapter")
    p.add_argument("--data", help="JSONL dataset (default: the job's validation set)")
    p.add_argument("--job", help="take the reward and sampling settings from this job file")
    p.add_argument("--reward", default="exact_match", help="preset reward when no --job is given")
    p.add_argument("--samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the job's, else 1.0)")
    p.add_argument("--max-new-tokens", type=int, help="default: the job's, else 256")
    p.add_argument("--limit", type=int, help="score only the first N examples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from openrft.data import load_dataset
    from openrft.engine.evaluation import evaluate
    from openrft.engine.setup import render_prompts
    from openrft.models import configure_threads, eos_token_ids, load_causal_lm, load_tokenizer, pick_device
    from openrft.rewards import RewardRunner, build_reward
    from openrft.rollout.local import TransformersGenerator
    from openrft.rollout.types import SamplingParams
    from openrft.spec import JobSpec, PresetReward, RewardSpec
    from openrft.spec.dialects import load_job

    if args.job:
        spec = load_job(args.job)
    else:
        if not (args.model and args.data):
            raise OpenRFTError("openrft eval needs --model and --data, or --job")
        spec = JobSpec.model_validate(
            {
                "model": {"name_or_path": args.model},
                "data": {"train": args.data},
                "training": {"prompts_per_step": 1, "total_steps": 1},
                "reward": RewardSpec(function=PresetReward(name=args.reward)).model_dump(),
            }
        )
    model_name = args.model or spec.model.name_or_path
    data = args.data or spec.data.validation or spec.data.train
    reward = build_reward(spec.reward)
    examples = load_dataset(data, reward.requires_reference)[: args.limit]
    configure_threads(spec.runtime.threads)
    device = pick_device(spec.runtime.device)
    tokenizer = load_tokenizer(model_name)
    model = load_causal_lm(model_name, device, __import__("torch").float32)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    prompts = render_prompts(tokenizer, examples, spec, data)
    generator = TransformersGenerator(model, tokenizer, eos_token_ids(tokenizer, model), tokenizer.pad_token_id)
    params = SamplingParams(
        n=args.samples,
        temperature=args.temperature if args.temperature is not None else spec.sampling.temperature,
        top_k=spec.sampling.top_k,
        top_p=spec.sampling.top_p,
        max_new_tokens=args.max_new_tokens or spec.sampling.max_new_tokens,
        max_length=spec.sampling.max_length,
    )
    runner = RewardRunner(reward)
    try:
        result = evaluate(generator, runner, examples, prompts, params, seed=args.seed, step=0)
    finally:
        runner.close()
    report = {
        "model": model_name,
        "adapter": args.adapter,
        "data": data,
        "examples": len(examples),
        "samples": result.samples,
        "mean_reward": result.mean_reward,
        "pass_rate": result.pass_rate,
        "errors": result.errors,
        "mean_response_length": result.mean_response_length,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{model_name}{' + ' + args.adapter if args.adapter else ''} on {data} ({len(examples)} examples): "
            f"mean reward {result.mean_reward:.4f}, pass rate {result.pass_rate:.1%}, errors {result.errors}"
        )
    return 0
