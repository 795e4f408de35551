"""The training loop of one RFT job: rollouts -> rewards -> advantages -> update, with evaluation,
checkpoints, metrics and resume."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import psutil
import torch

from openrft.data.sampler import EpochSampler
from openrft.engine.async_rollouts import AsyncRolloutSource
from openrft.engine.checkpoints import CheckpointInfo, CheckpointManager, save_adapter
from openrft.engine.engine_rollouts import EngineRolloutSource
from openrft.engine.evaluation import EvalResult, evaluate
from openrft.engine.local_runtime import LocalRuntime, Runtime
from openrft.engine.metrics import MetricsListener, MetricsSink, truncate_metrics_file
from openrft.engine.mlflow_tracking import MlflowTracker
from openrft.engine.outputs import output_mirror
from openrft.engine.phase_threads import Layout, PhaseThreads, describe, engine_measures, episodes_sampled_here
from openrft.engine.progress import ProgressReporter
from openrft.engine.rollouts import RolloutGroup, SyncRolloutSource
from openrft.engine.samples import SampleKind, SampleListener, SampleLog, sample_records
from openrft.engine.setup import JobParts, build_parts
from openrft.engine.step_flops import StepFlops
from openrft.engine.sync_check import SyncChecker
from openrft.engine.train_batch import build_train_batch
from openrft.errors import CheckpointError, OpenRFTError
from openrft.rewards.capture import REWARD_OUTPUT_FILE, output_log
from openrft.rewards.runner import RewardRunner
from openrft.rollout.types import SamplingParams
from openrft.spec.job import JobSpec
from openrft.storage import StorageError
from openrft.tools.agent_runtime import agent_generators
from openrft.tools.episodes import tool_generators
from openrft.tools.metrics import check_error_budget

Command = Literal["continue", "pause", "cancel"]
EVAL_SEED_OFFSET = 1_000_003


class JobControl:
    """Asked between steps whether to go on; the job service overrides ``poll`` (pause, cancel)."""

    def poll(self, step: int) -> Command:
        return "continue"


class StopAfter(JobControl):
    """Pause after a given step: used to interrupt a run deliberately (tests, budgets)."""

    def __init__(self, step: int):
        self.step = step

    def poll(self, step: int) -> Command:
        return "pause" if step > self.step else "continue"


class RFTJob:
    def __init__(
        self,
        spec: JobSpec,
        run_dir: str | Path,
        *,
        resume: bool = False,
        show_progress: bool = True,
        control: JobControl | None = None,
        listeners: tuple[MetricsListener, ...] = (),
        sample_listeners: tuple[SampleListener, ...] = (),
        on_event: Callable[[str, str], None] | None = None,
        runtime: Runtime | None = None,
        agent_base: str | None = None,
    ):
        """``runtime`` places the learner and generation replicas (default: this process); a spec with
        ``rollout.runtime: ray`` needs ``openrft.runtime.runtime_for(spec)``. ``listeners`` get each step's
        metrics, ``sample_listeners`` the samples recorded (``engine/samples.py``). ``agent_base``: where
        ``rollout.agent``'s agent reaches this job's agent routes (the job service's address; None: the
        routes the job serves on 127.0.0.1)."""
        self.spec = spec
        self.agent_base = agent_base
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.show_progress = show_progress
        self.control = control or JobControl()
        self.listeners = listeners
        self.sample_listeners = sample_listeners
        self.sample_log = SampleLog(self.run_dir, int(spec.tracking.samples_max_mb * 2**20))
        self.on_event = on_event or (lambda level, message: None)
        self.checkpoints = CheckpointManager(self.run_dir, spec.checkpoint.keep_top_k)
        self.mirror = output_mirror(spec.output_dir, self.run_dir)
        self.runtime = runtime or LocalRuntime()
        if spec.rollout.runtime != self.runtime.name:
            raise OpenRFTError(
                f"rollout.runtime is {spec.rollout.runtime!r} but the job was given the "
                f"{self.runtime.name!r} runtime; build it with openrft.runtime.runtime_for(spec)"
            )

    @classmethod
    def from_run_dir(
        cls, run_dir: str | Path, runtime_factory: Callable[[JobSpec], Runtime] | None = None, **kwargs
    ) -> RFTJob:
        """Resume the run in ``run_dir`` with the spec it was started with (and a runtime built for it)."""
        spec_path = Path(run_dir) / "spec.json"
        if not spec_path.exists():
            raise CheckpointError(f"{run_dir} is not an OpenRFT run directory (no spec.json)")
        spec = JobSpec.model_validate_json(spec_path.read_text())
        if runtime_factory is not None:
            kwargs["runtime"] = runtime_factory(spec)
        return cls(spec, run_dir, resume=True, **kwargs)

    # setup ----------------------------------------------------------------------------------------

    def _build(self) -> None:
        spec = self.spec
        measured = engine_measures(spec)  # before the threads chosen are recorded in the spec
        self.parts: JobParts = build_parts(spec, load_model=self.runtime.loads_model_locally)
        if self.runtime.loads_model_locally:  # the threads chosen here are recorded: a resumed run uses the same
            spec.runtime.threads = self.parts.threads
        learner_parts = self.runtime.build_learner(spec, self.parts)
        self.learner, self.model, self.generator = learner_parts.learner, learner_parts.model, learner_parts.generator
        self._note_micro_batch_cap()
        self.tool_service, wrap = None, (lambda generator: generator)
        if spec.tools is not None:  # multi-turn rollouts: every generator's completions become tool episodes
            self.tool_service, wrap = tool_generators(spec, self.parts)
            self.generator = wrap(self.generator)
        elif spec.rollout.agent is not None:  # the user's agent drives every trajectory (docs/agents.md)
            self.tool_service, wrap = agent_generators(spec, self.parts, self.run_dir, self.agent_base)
            self.generator = wrap(self.generator)
        self.rewards = RewardRunner(self.parts.reward)
        self.train_params = SamplingParams(
            n=spec.sampling.samples_per_prompt,
            temperature=spec.sampling.temperature,
            top_k=spec.sampling.top_k,
            top_p=spec.sampling.top_p,
            min_p=spec.sampling.min_p,
            max_new_tokens=self.parts.max_new_tokens,
            max_length=spec.sampling.max_length,
            ignore_eos=spec.sampling.ignore_eos,
        )
        self.eval_params = SamplingParams(
            n=spec.evaluation.samples_per_prompt,
            temperature=spec.evaluation.temperature
            if spec.evaluation.temperature is not None
            else spec.sampling.temperature,
            top_k=spec.sampling.top_k,
            top_p=spec.sampling.top_p,
            min_p=spec.sampling.min_p,
            max_new_tokens=self.parts.max_new_tokens,
            max_length=spec.sampling.max_length,
            ignore_eos=spec.sampling.ignore_eos,
        )
        sampler = EpochSampler(
            len(self.parts.datasets.train), spec.training.prompts_per_step, spec.data.shuffle, spec.training.seed
        )
        checker = None
        if spec.rollout.strategy != "sync" or spec.rollout.generation_engine != "local":  # weights are sent
            checker = SyncChecker.for_job(
                spec.rollout.sync_probe, self.parts.train_prompts, learner_parts.probe_scores, self.on_event
            )
        if spec.rollout.strategy == "sync" and spec.rollout.generation_engine != "local":
            self.rollouts = EngineRolloutSource(
                [wrap(r) for r in self.runtime.generation_replicas(spec, self.parts, learner_parts, self.run_dir)],
                self.rewards,
                sampler,
                self.parts.datasets.train,
                self.parts.train_prompts,
                self.train_params,
                adapter_state=learner_parts.adapter_state,
                version=lambda: self.learner.version,
                checker=checker,
            )
        elif spec.rollout.strategy == "sync":
            self.rollouts = SyncRolloutSource(
                self.generator,
                self.rewards,
                sampler,
                self.parts.datasets.train,
                self.parts.train_prompts,
                self.train_params,
            )
        else:
            replicas = [
                wrap(r) for r in self.runtime.generation_replicas(spec, self.parts, learner_parts, self.run_dir)
            ]
            self.rollouts = AsyncRolloutSource(
                replicas,
                self.rewards,
                sampler,
                self.parts.datasets.train,
                self.parts.train_prompts,
                self.train_params,
                batch_size=spec.training.prompts_per_step,
                age_tolerance=spec.rollout.age_tolerance,
                adapter_state=learner_parts.adapter_state,
                on_event=self.on_event,
                checker=checker,
            )
        self.sampler = sampler
        # the step's model FLOPs against this machine's matmul peak, where the model is in this process
        self.step_flops = StepFlops.for_model(self.model, spec) if self.runtime.loads_model_locally else None
        # generation and learning take turns in this process only with sync rollouts from the local generator
        self.release_processes = learner_parts.release_processes
        self.threads = PhaseThreads(
            self.parts.threads,
            enabled=measured and self.runtime.loads_model_locally,
            processes=learner_parts.processes,
            on_layout=learner_parts.use_processes,
            on_choice=self._layout_chosen,
            here_only=("generate",) if episodes_sampled_here(spec) else (),
        )
        if learner_parts.when_processes_lost is not None:
            learner_parts.when_processes_lost(self._processes_lost)

    def _layout_chosen(self, phase: str, chosen: Layout, rates: dict[Layout, float]) -> None:
        """Say which layout a phase keeps and why: each measured layout's seconds per 1,000 tokens."""
        measured = ", ".join(f"{describe(layout)} {rate * 1000:.3f} s" for layout, rate in rates.items())
        self.on_event("info", f"{phase}: {describe(chosen)} from now on, the fastest per 1,000 tokens ({measured})")
        self._release_unused_processes()

    def _processes_lost(self) -> None:
        """A learner process ended and the runtime ended the others: every phase runs in this process from now on."""
        self.threads.lose_processes()
        self.release_processes = None

    def _release_unused_processes(self) -> None:
        if self.threads.settled_alone() and self.release_processes is not None:
            self.release_processes()
            self.release_processes = None
            self.on_event("info", "every phase keeps this process alone: its learner processes ended, memory freed")

    def _state(self, step: int) -> dict:
        return {
            "step": step,
            "learner": self.learner.state_dict(),
            "rollouts": self.rollouts.state_dict(),
            "generator_rng": self.generator.rng.get_state(),
            "phase_threads": self.threads.state_dict(),
            "baseline_val_reward": self.baseline,
            "last_val_reward": self.last_val,
            "spec": self.spec.model_dump(mode="json"),
        }

    def _restore(self) -> int:
        removed = self.checkpoints.remove_partial()
        if removed:
            self.on_event("info", f"removed {len(removed)} unfinished checkpoint(s) of the interrupted run")
        info = self.checkpoints.latest()
        if info is None:
            raise CheckpointError(f"{self.run_dir} has no checkpoint to resume from")
        state = self.checkpoints.load_state(info)
        self.learner.load_state_dict(state["learner"])
        self.rollouts.load_state_dict(state["rollouts"])
        self.generator.rng.set_state(state["generator_rng"])
        if "phase_threads" in state:  # checkpoints written before threads were tuned per phase have none
            self.threads.load_state_dict(state["phase_threads"])
            self._release_unused_processes()
        self.generator.set_policy_version(self.learner.version)
        self.baseline = state["baseline_val_reward"]
        self.last_val = state["last_val_reward"]
        truncate_metrics_file(self.run_dir / "metrics.jsonl", info.step)
        self.sample_log.truncate_after(info.step)
        return info.step

    # the loop -------------------------------------------------------------------------------------

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self.runtime.close()

    def _run(self) -> dict:
        started = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.baseline: float | None = None
        self.last_val: float | None = None
        if self.mirror is not None:  # before anything is loaded: a wrong bucket fails in seconds
            self.mirror.check(resuming=self.resume)
        self._build()
        if (
            self.spec.rollout.replicas > 1
            and self.runtime.name == "local"
            and self.spec.rollout.learner_sharding == "none"
        ):
            self.on_event(
                "warn",
                f"rollout.replicas is {self.spec.rollout.replicas}: the local runtime trains with one learner "
                "(rollout.runtime ray runs that many data-parallel learners)",
            )
        start_step = self._restore() if self.resume else 0
        if not self.resume:
            (self.run_dir / "spec.json").write_text(self.spec.model_dump_json(indent=2))
        total = self.spec.training.total_steps
        tracker = (
            MlflowTracker.start(self.spec, self.run_dir, self.resume, self.on_event)
            if self.spec.tracking.mlflow_tracking_uri
            else None
        )
        sink = self.sink = MetricsSink(self.run_dir, self.spec.tracking.tensorboard, self.sample_log)
        for listener in (*self.listeners, *((tracker.log_metrics,) if tracker else ())):
            sink.add_listener(listener)
        for sample_listener in (*self.sample_listeners, *((tracker.log_samples,) if tracker else ())):
            sink.add_sample_listener(sample_listener)
        progress = ProgressReporter(total, start_step, enabled=self.show_progress)
        status = "succeeded"
        step = start_step
        try:
            if start_step == 0 and self.spec.evaluation.at_start:
                result = self._evaluate(0)
                self.baseline = result.mean_reward
                sink.emit(0, result.metrics(self.spec.evaluation.samples_per_prompt, self.spec.evaluation))
                progress.eval_done(0, result.mean_reward, result.pass_rate)
            for step in range(start_step + 1, total + 1):
                command = self.control.poll(step)
                if command != "continue":
                    status = "paused" if command == "pause" else "cancelled"
                    step -= 1
                    latest = self.checkpoints.latest()
                    if command == "pause" and (latest is None or latest.step != step):
                        self._checkpoint(step, self.last_val)
                    break
                metrics = self._train_step(step)
                val = None
                if self._due(step, self.spec.evaluation.interval) or step == total:
                    result = self._evaluate(step)
                    val = self.last_val = result.mean_reward
                    metrics.update(result.metrics(self.spec.evaluation.samples_per_prompt, self.spec.evaluation))
                    progress.eval_done(step, result.mean_reward, result.pass_rate)
                # metrics first: a checkpoint at step N then implies N's metrics were written, so a run
                # killed between the two resumes from the previous checkpoint and rewrites them once
                sink.emit(step, metrics)
                if self._due(step, self.spec.checkpoint.interval) or step == total:
                    info = self._checkpoint(step, val)
                    self.on_event("info", f"checkpoint saved at step {step}: {info.path}")
                progress.step_done(step, metrics.get("critic/rewards/mean"), metrics["perf/time_per_step"])
                if self._due(step, self.spec.checkpoint.interval) and step != total:
                    self._mirror_outputs(final=False)
        except BaseException:
            if tracker is not None:
                tracker.finish("failed", None)
            raise
        finally:
            progress.close()
            sink.close()
            self.rollouts.close()
            self.rewards.close()
            if self.tool_service is not None:
                self.tool_service.close()
        try:
            summary = self._finish(status, step, time.monotonic() - started)  # uploads to a remote output location
        except BaseException:
            if tracker is not None:
                tracker.finish("failed", None)
            raise
        if tracker is not None:
            tracker.finish(
                status,
                self.run_dir / "adapter" if status == "succeeded" else None,
                (self.run_dir / "manifest.json", self.run_dir / "summary.json"),
            )
        progress.summary(summary)
        return summary

    def _note_micro_batch_cap(self) -> None:
        """Say so when the learner holds fewer tokens per micro-batch than asked, to fit its memory."""
        cap, requested = getattr(self.learner, "micro_batch_cap", None), self.spec.training.micro_batch_tokens
        if cap is None or cap >= requested:
            return
        need = requested * self.learner.activation_bytes_per_token / 2**30
        self.on_event(
            "info",
            f"micro-batches hold at most {cap:,} tokens, not training.micro_batch_tokens {requested:,}: that many "
            f"would keep about {need:.1f} GiB of activations, more than half the memory available; the gradient "
            "is the same, in more passes",
        )

    def _checkpoint(self, step: int, val_reward: float | None) -> CheckpointInfo:
        return self.checkpoints.save(step, self.model, self._state(step), val_reward, self.learner.version)

    def _mirror_outputs(self, final: bool) -> None:
        """Upload the run directory to the job's remote output location. During training a failed upload is a
        warning (the next checkpoint tries again); at the end it fails the job, naming where the outputs are."""
        if self.mirror is None:
            return
        try:
            count = self.mirror.sync()
        except StorageError as exc:
            if final:
                raise StorageError(exc.uri, f"{exc.reason}; the outputs are in {self.run_dir.resolve()}") from None
            self.on_event("warn", f"upload to {exc.uri} failed ({exc.reason}); retried at the next checkpoint")
            return
        self.on_event("info", f"uploaded {count} file(s) to {self.mirror.uri}")

    def _log_reward_output(self, step: int, groups: list) -> None:
        """What user reward code printed, kept apart from OpenRFT's output in RUN_DIR/reward_output.log."""
        printed = [(f"example {g.example.id}, sample {j}", o.stdout) for g in groups for j, o in enumerate(g.outcomes)]
        text = output_log(step, printed)
        if text:
            with (self.run_dir / REWARD_OUTPUT_FILE).open("a", encoding="utf-8") as f:
                f.write(text)

    @staticmethod
    def _due(step: int, interval: int) -> bool:
        return interval > 0 and step % interval == 0

    def _train_step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.threads.phase("generate") as generation:
            groups = self.rollouts.next_batch(step)
            generation.work = sum(len(c.token_ids) for g in groups for c in g.completions)
        t1 = time.perf_counter()
        samples, metrics, advantages = build_train_batch(groups, self.spec, self.learner.version)
        self._log_reward_output(step, groups)
        self._record_samples("train", step, groups, advantages)
        self._check_episode_errors(groups, f"training step {step}")
        learn_s = None
        if samples:
            with self.threads.phase("learn") as learning:
                learn_start = time.perf_counter()
                metrics.update(self.learner.step(samples))
                learn_s = time.perf_counter() - learn_start
                learning.work = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        else:
            self.on_event("warn", f"step {step}: every sample's reward failed; no update")
        self.generator.set_policy_version(self.learner.version)
        self.rollouts.policy_updated(self.learner.version)
        t2 = time.perf_counter()
        tokens = sum(len(g.prompt_ids) + len(c.token_ids) for g in groups for c in g.completions)
        metrics.update(
            {
                "perf/time_per_step": t2 - t0,
                "perf/throughput": tokens / (t2 - t0),
                "timing/sampling_and_reward": t1 - t0,
                "timing/training": t2 - t1,
                "perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / 2**30,
                "training/epoch": self.sampler.epochs_done,
                "training/policy_version": float(self.learner.version),
            }
        )
        metrics.update(self.rollouts.step_metrics())
        metrics.update(self.threads.metrics())
        if self.step_flops is not None:
            generate_s = getattr(self.rollouts, "generate_seconds", None)
            metrics.update(self.step_flops.metrics(groups, samples, t2 - t0, generate_s, learn_s))
        if torch.cuda.is_available():
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
        return metrics

    def _evaluate(self, step: int) -> EvalResult:
        with self.threads.phase("generate", measured=False):
            result = evaluate(
                self.generator,
                self.rewards,
                self.parts.datasets.validation,
                self.parts.val_prompts,
                self.eval_params,
                self.spec.training.seed + EVAL_SEED_OFFSET,
                step,
            )
        if self.spec.tracking.eval_samples:
            self._record_samples("eval", step, result.rollouts)
        self._check_episode_errors(result.rollouts, f"the evaluation at step {step}")
        return result

    def _check_episode_errors(self, groups: list[RolloutGroup], batch: str) -> None:
        """Tool episodes end on their own errors and the job goes on, until a batch's share of them is
        past ``tools.error_budget`` (after the batch's samples are recorded, for a look at them)."""
        budget = self.spec.tools or self.spec.rollout.agent
        if budget is not None:
            completions = [c for g in groups for c in g.completions]
            check_error_budget(completions, budget.error_budget, batch)

    def _record_samples(
        self, kind: SampleKind, step: int, groups: list[RolloutGroup], advantages: torch.Tensor | None = None
    ) -> None:
        """The samples of the first ``tracking.sample_prompts_per_step`` prompts of a training batch (the batch
        is in sampled order), or of every validation prompt; before the step's metrics, as they are."""
        if kind == "train":
            count = self.spec.tracking.sample_prompts_per_step
            groups = groups[:count]
            advantages = advantages[:count] if advantages is not None else None
        if not groups:
            return
        records = sample_records(kind, step, groups, self.rewards.function.name, self.learner.version, advantages)
        self.sink.emit_samples(kind, step, records)

    def _finish(self, status: str, step: int, wall_seconds: float) -> dict:
        adapter_dir = self.run_dir / "adapter"
        best = self.checkpoints.best()
        if status == "succeeded":
            save_adapter(self.model, adapter_dir)
        summary = {
            "status": status,
            "steps": step,
            "total_steps": self.spec.training.total_steps,
            "baseline_val_reward": self.baseline,
            "final_val_reward": self.last_val,
            "best_checkpoint": best.path if best else None,
            "best_val_reward": best.val_reward if best else None,
            "adapter_path": str(adapter_dir.resolve()) if status == "succeeded" else "",
            "wall_seconds": wall_seconds,
            "base_model": self.spec.model.name_or_path,
        }
        if self.mirror is not None:
            summary["output_uri"] = self.mirror.uri
        if status == "succeeded":
            manifest = {
                "checkpoint_path": self._location(adapter_dir),
                "base_model": self.spec.model.name_or_path,
                "job_name": self.spec.name,
                "steps": step,
                "checkpoints": [self._location(c.path) for c in self.checkpoints.list()],
            }
            _write_json(self.run_dir / "manifest.json", manifest)
        _write_json(self.run_dir / "summary.json", {k: _json_safe(v) for k, v in summary.items()})
        self._mirror_outputs(final=True)
        return summary

    def _location(self, path: Path | str) -> str:
        """Where an output lives for whoever reads the manifest: its URI when mirrored, else its local path."""
        return self.mirror.uri_of(path) if self.mirror is not None else str(Path(path).resolve())


def _json_safe(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
