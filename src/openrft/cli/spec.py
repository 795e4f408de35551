"""``openrft spec explain FILE`` and ``openrft spec validate FILE``: a job in any dialect, resolved or checked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from openrft.cli.pending import pending_mappings, train_command, unreachable
from openrft.errors import OpenRFTError
from openrft.spec.errors import FieldProblem, SpecError

ORIGIN_STYLE = {"user": "green", "default": "dim", "derived": "cyan"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spec", help="explain or validate a job file (Nova recipe, Vertex request, OpenAI job)")
    spec_sub = p.add_subparsers(dest="spec_command", required=True)
    explain = spec_sub.add_parser(
        "explain", help="print the resolved spec: each value, where it came from, and the number of steps"
    )
    validate = spec_sub.add_parser("validate", help="check a job, its reward and its datasets without training")
    for q in (explain, validate):
        q.add_argument("job", help="the job file (YAML or JSON, any dialect)")
        q.add_argument("--dialect", choices=["nova", "vertex", "openai", "canonical"], help="skip detection")
        q.add_argument("--json", action="store_true", help="print JSON")
        add_mapping_options(q)
    for q in (explain, validate):
        q.add_argument(
            "--output",
            "-o",
            metavar="DIR",
            help="the run directory of openrft train --output: takes precedence over the job's output location",
        )
    explain.add_argument("--all", action="store_true", help="also list values left at OpenRFT's defaults")
    explain.set_defaults(handler=run_explain)
    validate.set_defaults(handler=run_validate)


def add_mapping_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--map-lambda",
        action="append",
        default=[],
        metavar="[ARN=]TARGET",
        help="run the job's reward Lambda ARN as TARGET: a handler file (reward.py:lambda_handler) or an http(s) "
        "URL; without ARN=, the job's one Lambda (also a blank one). Repeatable; adds to openrft.lambda_map",
    )
    parser.add_argument(
        "--map-model",
        action="append",
        default=[],
        metavar="NAME=TARGET",
        help="train TARGET (a local path or Hugging Face id, e.g. openrft-demo) where the job names the cloud "
        "model NAME. Repeatable; adds to openrft.model_map",
    )
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="replace every value of the job that is exactly FROM by TO: a gs:// or s3:// dataset, an OpenAI file "
        "id, a hosted judge model, a reward URL (docs/compatibility.md). Repeatable",
    )


def mappings(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """``--map-lambda``/``--map-model`` as ``openrft`` block entries; relative handler files are made absolute
    against the current directory (the file's own ``openrft`` entries are read against the job file)."""
    from openrft.spec.dialects.lambdas import ANY_LAMBDA, resolve_handler

    lambdas: dict[str, str] = {}
    for value in getattr(args, "map_lambda", None) or []:
        arn, sep, target = value.partition("=") if value.startswith("arn:") else ("", "", value)
        if value.startswith("arn:") and not sep:
            raise OpenRFTError(f"--map-lambda {value}: write ARN=TARGET, e.g. {value}=reward.py:lambda_handler")
        lambdas[arn or ANY_LAMBDA] = resolve_handler(target, Path.cwd()) or target
    models: dict[str, str] = {}
    for value in getattr(args, "map_model", None) or []:
        name, sep, target = value.rpartition("=")
        if not sep or not name or not target:
            raise OpenRFTError(f"--map-model {value}: write NAME=TARGET, e.g. nova-lite-2/prod=openrft-demo")
        models[name] = target
    return {"lambda_map": lambdas, "model_map": models}


def replacements(args: argparse.Namespace) -> dict[str, str]:
    """``--map FROM=TO``: values of the job document replaced before it is read (``openrft.spec.mapping``)."""
    from openrft.spec.mapping import parse_mappings

    return parse_mappings(getattr(args, "map", None))


def resolve_from_args(args: argparse.Namespace):
    """The job file named on the command line, resolved with its mapping options and counted datasets; a local
    ``--output`` replaces the job's output location (``output_precedence``)."""
    from openrft.data.loader import count_examples
    from openrft.spec.dialects import resolve_job

    resolution = resolve_job(
        args.job, args.dialect, dataset_size=count_examples, mappings=mappings(args), replacements=replacements(args)
    )
    if getattr(args, "output", None):
        output_precedence(resolution, args.output)
    return resolution


def output_precedence(resolution, output: str) -> None:
    """``--output DIR`` is where the run is written, whatever output location the job names (a Bedrock
    request's required ``outputDataConfig.s3Uri``, a recipe's ``output_s3_path``): nothing goes to that
    location, and ``spec explain`` says which one was set aside."""
    from openrft.spec.provenance import Source

    spec = resolution.spec
    previous, source = spec.output_dir, resolution.provenance.get("output_dir")
    spec.output_dir = str(Path(output).expanduser().resolve())
    note = "--output takes precedence"
    if previous:
        where = f"{source.field} " if source and source.field else ""
        note += f" over {where}{previous!r} (nothing is written there; train --staging DIR uploads to it)"
    resolution.provenance["output_dir"] = Source("user", "--output", note)


def run_explain(args: argparse.Namespace) -> int:
    from openrft.spec.provenance import OPENRFT_DEFAULT, leaf_paths
    from openrft.spec.tools import masked_headers

    resolution = resolve_from_args(args)
    if args.json:
        print(json.dumps(resolution.to_json(), indent=2))
        return 0
    spec = resolution.spec
    console = Console(highlight=False, soft_wrap=True)
    console.print(_summary(args.job, resolution))
    console.print(f"learner: {learner_layout(spec)}")
    console.print(f"generation: {generation_layout(spec)}")
    values = leaf_paths(masked_headers(spec.model_dump(mode="json")))  # tools' headers hold tokens
    for path, source in resolution.provenance.items():
        if source.note == OPENRFT_DEFAULT and not args.all:
            continue
        value = values.get(path, _subtree(values, path))
        where = "; ".join(x for x in (f"from {source.field}" if source.field else None, source.note) if x)
        console.print(
            f"  [bold]{path}[/] = {_short(value)}  [{ORIGIN_STYLE[source.origin]}]{source.origin}[/]"
            f"{'  [dim](' + escape(where) + ')[/]' if where else ''}"
        )
    hidden = sum(1 for s in resolution.provenance.values() if s.note == OPENRFT_DEFAULT)
    if hidden and not args.all:
        console.print(f"[dim]{hidden} more value(s) at OpenRFT's defaults: --all lists them[/]")
    for warning in resolution.warnings:
        console.print(f"[yellow]warning:[/] {warning}", markup=True)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    try:
        resolution = resolve_from_args(args)
    except SpecError as exc:
        error = with_location_problems(exc)
        pending = pending_mappings(error, error.partial.get("output_dir", (None, None))[1])
        if pending is None:
            raise error from None
        return report_pending(args, pending)
    fields = {path: source.field for path, source in resolution.provenance.items() if source.field}
    report = check_job(resolution.spec, fields)
    if pending := report.pop("pending"):
        return report_pending(args, pending)
    report["total_steps"] = resolution.total_steps
    report["warnings"] = [str(w) for w in resolution.warnings]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["valid"] else 1
    console = Console(highlight=False, soft_wrap=True)
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
    if not report["valid"]:
        if len(report["problems"]) == 1:
            raise OpenRFTError(f"{args.job} is not a valid job: {report['problems'][0]}")
        lines = "\n".join(f"  - {p}" for p in report["problems"])
        raise OpenRFTError(f"{args.job} is not a valid job: {len(report['problems'])} problem(s):\n{lines}")
    console.print(
        f"[green]valid:[/] {args.job}: {report['train_examples']:,} training and "
        f"{report['validation_examples']:,} validation examples, {resolution.total_steps} steps of "
        f"{resolution.spec.training.prompts_per_step} prompts × {resolution.spec.sampling.samples_per_prompt}"
        f" samples{'' if report['prompts_checked'] else ' (prompt lengths not checked: model not local)'}"
    )
    return 0


def report_pending(args: argparse.Namespace, pending: list[FieldProblem]) -> int:
    """A job valid as written whose references to its cloud are still to map (``cli/pending.py``): each, and
    the one command that trains it here. Exit 0: the job is not wrong; ``train`` refuses it until mapped."""
    command = train_command(args.job, pending)
    if args.json:
        to_map = [{"field": p.path, "problem": str(p), "remedy": p.remedy} for p in pending]
        print(json.dumps({"valid": True, "runnable": False, "to_map": to_map, "train_command": command}, indent=2))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    console.print(
        f"[green]valid as written:[/] {escape(args.job)}; it names {len(pending)} thing(s) only its cloud service "
        "has, to map before it trains here:"
    )
    for problem in pending:
        console.print(f"  - {escape(str(problem))}")
    console.print(f"to train here: {escape(command)}")
    return 0


def with_location_problems(error: SpecError) -> SpecError:
    """``error`` plus the problems of the datasets and output location it names but does not report
    (every bad line, an unreachable store), so that a job's problems come all at once."""
    from openrft.data.loader import DatasetError, load_dataset
    from openrft.storage import StorageError, check_output_location, is_object_store

    reported = {p.path for p in error.problems} | {p.value for p in error.problems if isinstance(p.value, str)}
    extra: list[FieldProblem] = []
    for path in ("data.train", "data.validation"):
        location, field = error.partial.get(path, (None, None))
        if location is None or field in reported or location in reported:
            continue
        try:
            load_dataset(location, False, None)
        except DatasetError as exc:
            extra += [FieldProblem(field or path, str(p)) for p in exc.problems]
    output, field = error.partial.get("output_dir", (None, None))
    if is_object_store(output) and field not in reported:
        try:
            check_output_location(output)
        except StorageError as exc:
            extra.append(FieldProblem(field or "output_dir", str(exc)))
    if not extra:
        return error
    combined = SpecError([*error.problems, *extra], error.source)
    combined.partial = error.partial
    return combined


def check_job(spec, fields: dict[str, str]) -> dict[str, Any]:
    """Every problem of a resolved job that can be found without training: the reward can be built, the
    datasets load (all bad lines of both files), the model resolves and, when it is local, every prompt
    fits ``max_length``, and an object-store output location can be written to. ``fields``: the user's field
    of a canonical path (``data.train`` -> ``run.data_s3_path``), for the problems' names.
    A bucket whose store does not answer at all is ``pending`` (to map), or one more problem when there are
    others."""
    from openrft.data.loader import DatasetError, load_dataset
    from openrft.engine.setup import held_out_validation, render_prompts, tool_template_problems
    from openrft.models import load_tokenizer, resolve_model_path
    from openrft.storage import StorageError, check_output_location, is_object_store

    output_field = fields.get("output_dir", "output")
    problems: list[str] = []
    pending: list[FieldProblem] = []  # references to an unreachable bucket: to map (``cli/pending.py``)
    require_reference = False
    try:
        from openrft.rewards import build_reward

        require_reference = build_reward(spec.reward).requires_reference
    except OpenRFTError as exc:
        problems.append(f"reward: {exc}")
    loaded = {}
    for name, location, limit in (
        ("train", spec.data.train, spec.data.train_examples_limit),
        ("validation", spec.data.validation, spec.data.validation_examples_limit),
    ):
        if location is None:
            continue
        if store := unreachable(location, fields.get(f"data.{name}", f"data.{name}")):
            pending.append(store)
            continue
        try:
            loaded[name] = load_dataset(location, require_reference, limit)
        except DatasetError as exc:
            problems += [str(p) for p in exc.problems]
    train, validation = loaded.get("train", []), loaded.get("validation", [])
    if "train" in loaded and spec.data.validation is None:
        train, validation = held_out_validation(spec, train)
    if spec.tools is not None and spec.tools.mcp_servers:  # as the job does: the servers' tools join the rows
        problems += mcp_problems(spec.tools, train + validation)
    prompts_checked = False
    try:
        local = Path(resolve_model_path(spec.model.name_or_path)).exists()  # else a hub id: not fetched here
        if local and train:
            tokenizer = load_tokenizer(spec.model.name_or_path, spec.model.revision)
            for examples, location in ((train, spec.data.train), (validation, spec.data.validation or spec.data.train)):
                try:
                    render_prompts(tokenizer, examples, spec, location)
                except DatasetError as exc:
                    problems += [str(p) for p in exc.problems]
            prompts_checked = True
            if spec.tools is not None:
                problems += [f"model: {p}" for p in tool_template_problems(spec, tokenizer, train + validation)]
    except OpenRFTError as exc:
        problems.append(f"model: {exc}")
    if spec.tools is not None:
        problems += tool_file_problems(spec.tools)
    if store := unreachable(spec.output_dir, output_field, output=True):
        pending.append(store)
    elif is_object_store(spec.output_dir):
        try:
            check_output_location(spec.output_dir)
        except StorageError as exc:
            problems.append(f"{output_field}: {exc}")
    return {
        "valid": not problems,
        "problems": [*problems, *(str(p) for p in pending)] if problems else problems,
        "pending": [] if problems else pending,
        "train_examples": len(train),
        "validation_examples": len(validation),
        "prompts_checked": prompts_checked,
    }


def mcp_problems(tools, examples) -> list[str]:
    """The job's MCP servers reached and their tools listed (stdio servers started, then stopped), their tools
    added to ``examples`` as a job adds them; a server a service's operator registered is left to that service.
    A server that cannot be reached is named with its URL or command and the cause."""
    from openrft.tools.mcp import add_mcp_tools

    servers = {name: server for name, server in tools.mcp_servers.items() if server.registered is None}
    if not servers:
        return []
    try:
        add_mcp_tools(tools.model_copy(update={"mcp_servers": servers}), examples)
    except OpenRFTError as exc:
        return [str(exc)]
    return []


def tool_file_problems(tools) -> list[str]:
    """The tools' files that are not there: a Python tool's ``file.py`` (and its function, read without
    running it), an environment's ``env.py``, a stdio MCP server's working directory."""
    import ast

    problems = []
    for name, runner in tools.functions.items():
        module, _, function = getattr(runner, "function", "").rpartition(":")
        if not module.endswith(".py"):
            continue
        field = f"tools.functions.{name}.function"
        path = Path(module)
        if not path.is_file():
            problems.append(f"{field}: no file {path} (give file.py:function, relative to the job file)")
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError) as exc:
            problems.append(f"{field}: {path} is not valid Python: {exc}")
            continue
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        defined |= {(a.asname or a.name) for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        if function not in defined:
            problems.append(f"{field}: {path} defines no function {function!r}")
    environment = tools.environment
    if environment is not None and environment.module.endswith(".py") and not Path(environment.module).is_file():
        problems.append(f"tools.environment.module: no file {environment.module}")
    for name, server in tools.mcp_servers.items():
        if server.command is not None and server.cwd is not None and not Path(server.cwd).is_dir():
            problems.append(f"tools.mcp_servers.{name}.cwd: no directory {server.cwd}")
    return problems


def _summary(job: str, resolution) -> str:
    spec = resolution.spec
    training = spec.training
    epochs = f", {training.epochs:.3g} epoch(s)" if training.epochs is not None else ""
    prompts = f" of {resolution.dataset_prompts:,} training prompts" if resolution.dataset_prompts else ""
    return (
        f"[bold]{job}[/]: {spec.dialect} job [bold]{spec.name}[/] → [bold]{training.total_steps} steps[/]"
        f"{epochs}{prompts}; {training.prompts_per_step} prompts × {spec.sampling.samples_per_prompt} samples "
        f"= {spec.samples_per_step} samples per step"
    )


def learner_layout(spec) -> str:
    """How the learner runs: one copy, data-parallel copies, or one policy sharded (docs/scaling.md)."""
    rollout, learners = spec.rollout, spec.rollout.replicas
    tuning = "LoRA" if spec.lora.enabled else "full fine-tuning"
    if rollout.learner_sharding == "fsdp":
        where = "Ray actors" if rollout.runtime == "ray" else "torchrun processes"
        return (
            f"{tuning}, one policy sharded with FSDP2 over {learners} {where} (rollout.learner_sharding fsdp): "
            f"each holds 1/{learners} of the weights, gradients and optimizer state between steps"
        )
    if learners > 1 and rollout.runtime == "ray":
        return f"{tuning}, {learners} data-parallel learners on Ray actors, each a full copy of the policy"
    from openrft.engine.phase_threads import episodes_sampled_here
    from openrft.runtime.placement import local_processes_wanted

    if rollout.runtime == "local" and local_processes_wanted(spec):
        count = spec.runtime.processes or "one per core"
        where = f"{tuning}, the job's learner and learner processes of this machine ({count}; runtime.processes), each "
        if spec.runtime.threads is not None:
            return f"{where}a full copy of the policy, {spec.runtime.threads} thread(s) each: every phase on all"
        if episodes_sampled_here(spec):
            return (
                f"{where}a full copy of the policy: learning runs on all of them, data-parallel, or in the job's "
                "process alone, as measured faster in the first steps (runtime.threads unset); the episodes are "
                "sampled in the job's process, in one continuous decode batch"
            )
        return (
            f"{where}a full copy of the policy: each phase (sampling, learning) runs on all of them, data-parallel, "
            "or in the job's process alone, as measured faster in the first steps (runtime.threads unset)"
        )
    return f"{tuning}, one learner holding the whole policy"


def generation_layout(spec) -> str:
    """What generates rollouts (rollout.engine) and the rollout correction against it (docs/scaling.md)."""
    rollout = spec.rollout
    engine = rollout.generation_engine
    auto = " (rollout.engine auto)" if rollout.engine == "auto" else ""
    if engine == "server":
        where = f"server(s) {', '.join(rollout.generator_base_url)}"
        what = f"{rollout.strategy} rollouts from {where}{auto}, the policy's weights sent to it after each update"
    elif engine == "vllm":
        what = f"{rollout.strategy} rollouts from vLLM's LLM engine in the learner's process (rollout.engine vllm)"
    else:
        what = f"{rollout.strategy} rollouts from the learner's own model, OpenRFT's sampler{auto}"
    mode = rollout.correction_mode
    if mode == "off":
        return f"{what}; rollout correction off"
    c = rollout.correction
    return f"{what}; rollout correction {mode} at {c.level} level, cap {c.cap:g}"


def _subtree(values: dict[str, Any], path: str) -> dict[str, Any]:
    return {k[len(path) + 1 :]: v for k, v in values.items() if k.startswith(path + ".")}


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return escape(text if len(text) <= width else text[: width - 1] + "…")
