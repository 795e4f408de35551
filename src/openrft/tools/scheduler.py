"""Tool episodes scheduled independently: an episode's next turn is sampled as soon as its own calls are back.

Lock-step (``tools.schedule: lockstep``) samples turn ``k`` of every episode in one batch once every call of
turn ``k - 1`` has returned, so each turn waits for the slowest tool and the longest generation of the batch.
Here each episode moves on its own: its calls run on the tool loop while other episodes generate, and
whenever the generator is free, every episode whose results are back (and every newly admitted prompt's
first turn) is sampled in the next batch. With ``tools.max_episodes_in_flight`` set, prompts beyond it wait
and start as soon as running episodes end, so a long ``generate`` keeps the generator full (continuous
batching across episodes, turn by turn). A generator that declares ``concurrent_requests`` (a remote
server: ``generator_base_url``) gets up to that many batches in flight at once; the server batches them
itself. The episodes' tokens are exactly those of lock-step; only which batch a turn is sampled in differs,
so with a seed the samples are reproducible in lock-step only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any

from openrft.rollout.types import Completion, SamplingParams

Episode = Any  # openrft.tools.episodes.Episode (not imported: episodes imports this module)

GATHER_S = 0.01
"""How long a free generator waits for more results when calls are still in flight: episodes whose tools
answer within it join the same batch instead of the next one."""
SEED_STRIDE = 7919


class EpisodeScheduler:
    """Runs one ``generate``'s episodes to their ends (see the module docstring); ``episodes``: the
    ``ToolGenerator`` whose turns and calls it schedules."""

    def __init__(self, episodes: Any, params: SamplingParams, seed: int | None):
        self.episodes, self.params, self.seed = episodes, params, seed
        self.cap = episodes.spec.max_episodes_in_flight
        self.parallel = max(1, int(getattr(episodes.inner, "concurrent_requests", 1) or 1))
        self.batches = 0
        self.active = 0  # admitted episodes not yet ended
        self.ready: list[Episode] = []  # episodes whose next (later, or opened first) turn can be sampled
        self.ready_groups: list[int] = []  # prompts whose n episodes start from one shared prefill
        self.tools: dict[Future, Episode] = {}
        self.generating: dict[Future, Callable[[Any], None]] = {}

    def run(self, prompts: list[list[int]], groups: list[list[Episode]]) -> None:
        self.prompts, self.groups = prompts, groups
        if getattr(self.episodes.inner, "continuous", False):
            self._run_continuous()
            return
        waiting = deque(range(len(groups)))
        with ThreadPoolExecutor(self.parallel, thread_name_prefix="openrft-turns") as pool:
            while True:
                while waiting and self._room(len(groups[waiting[0]])):
                    self._admit(waiting.popleft())
                if (self.ready or self.ready_groups) and len(self.generating) < self.parallel:
                    if self.tools and not self.generating:
                        self._settle(wait(list(self.tools), timeout=GATHER_S, return_when=FIRST_COMPLETED)[0])
                    self._launch(pool)
                    continue
                if not self.tools and not self.generating:
                    if waiting:
                        continue
                    break
                self._settle(wait([*self.tools, *self.generating], return_when=FIRST_COMPLETED)[0])

    def _run_continuous(self) -> None:
        """The local generator: one decode batch that each ready turn joins between decode steps (each later
        turn continuing its episode's kept KV cache), and that hands each turn back as soon as it ends."""
        waiting = deque(range(len(self.groups)))
        with self.episodes.inner.decoding(self.params, self.seed) as session:
            self.session = session
            while True:
                while waiting and self._room(len(self.groups[waiting[0]])):
                    self._admit(waiting.popleft())
                self._submit(session)
                if session.busy:
                    session.step()
                    self._settle({f for f in self.tools if f.done()})
                elif self.tools:
                    self._settle(wait(list(self.tools), return_when=FIRST_COMPLETED)[0])
                elif not waiting:
                    break

    def _submit(self, session: Any) -> None:
        """Every ready first turn (the ``n`` episodes of a prompt from one prefill) and later turn, into ``session``."""
        for index in self.ready_groups:
            group = [e for e in self.groups[index] if not e.done]
            limit = self.params.completion_limit(len(self.prompts[index]))
            session.submit(
                list(self.prompts[index]),
                [min(limit, e.remaining) for e in group],
                [self._turn_callback(e) for e in group],
                [e.episode_id for e in group],
            )
        for episode in self.ready:
            session.submit(episode.context, [episode.remaining], [self._turn_callback(episode)], [episode.episode_id])
        self.ready_groups, self.ready = [], []

    def _turn_callback(self, episode: Episode) -> Callable[[Completion], bool]:
        """Takes the turn; says whether the episode goes on (only then is its KV cache kept for the next turn)."""

        def done(completion: Completion) -> bool:
            self._turns([episode], [completion])
            return not episode.done

        return done

    def _room(self, episodes: int) -> bool:
        return self.cap is None or self.active == 0 or self.active + episodes <= self.cap

    def _admit(self, index: int) -> None:
        group = [e for e in self.groups[index] if not e.done]
        self.active += len(group)
        if any(e.opened for e in self.groups[index]):
            self.ready += group  # each opened episode from its own prompt
        elif group:
            self.ready_groups.append(index)

    def _seed(self) -> int | None:
        self.batches += 1
        return None if self.seed is None else self.seed + SEED_STRIDE * self.batches

    def _launch(self, pool: ThreadPoolExecutor) -> None:
        """The next batch: the shared first turns of newly admitted prompts, or every ready episode's turn."""
        generate = self.episodes.inner.generate
        if self.ready_groups:
            indices, self.ready_groups = self.ready_groups, []
            future = pool.submit(generate, [list(self.prompts[i]) for i in indices], self.params, self._seed())
            self.generating[future] = lambda sampled: self._first_turns(indices, sampled)
            return
        batch, self.ready = self.ready, []
        params = replace(self.params, n=1, max_new_tokens=max(e.remaining for e in batch))
        future = pool.submit(generate, [e.context for e in batch], params, self._seed())
        self.generating[future] = lambda sampled: self._turns(batch, [c for (c,) in sampled])

    def _first_turns(self, indices: list[int], sampled: list[list[Completion]]) -> None:
        for i, completions in zip(indices, sampled):
            self._turns([e for e in self.groups[i] if not e.done], completions)

    def _turns(self, batch: list[Episode], completions: list[Completion]) -> None:
        for episode, completion in zip(batch, completions):
            self.episodes._model_turn(episode, completion)
            self._next(episode)

    def _next(self, episode: Episode) -> None:
        """After a model turn or a tool turn: run its calls, sample its next turn, or count its end."""
        if episode.done:
            self.active -= 1
        elif episode.pending:
            coroutine = self.episodes._run_calls([episode])
            self.tools[asyncio.run_coroutine_threadsafe(coroutine, self.episodes.service.loop)] = episode
        else:
            self.ready.append(episode)

    def _settle(self, done: set[Future]) -> None:
        for future in done:
            if future in self.tools:
                episode = self.tools.pop(future)
                future.result()
                self.episodes.after_calls(episode)
                self._next(episode)
            elif future in self.generating:
                self.generating.pop(future)(future.result())
