"""A job's Ray actors lost with their node (or their worker process): told apart from the job's own errors.

``lost_actors(exc)`` walks ``exc``'s cause and context chain for Ray's errors of a lost actor, node or object
owner (``RayActorError`` and its ``ActorDiedError``/``ActorUnavailableError``, ``NodeDiedError``,
``OwnerDiedError``, ``WorkerCrashedError``, ...) and says what was lost, naming the node where Ray's message
does. Ray is not imported: a process that never used Ray has none of its errors (``ray.exceptions`` is looked up
in ``sys.modules``). The service's job process hands such a job back to be resumed from its last checkpoint on
the remaining nodes (docs/scaling.md, "The service on a Ray cluster").
"""

from __future__ import annotations

import re
import sys
from typing import Any

from openrft.runtime.local_processes import ProcessLost

PEER_LOSS_WAIT_S = 30.0  # how long a failed collective waits for its lost peer's error to arrive

LOSS_ERRORS = (
    "RayActorError",  # ActorDiedError, ActorUnavailableError
    "NodeDiedError",
    "OwnerDiedError",
    "WorkerCrashedError",
    "LocalRayletDiedError",
    "ObjectLostError",  # OwnerDiedError, ObjectReconstructionFailed...
)
_NODE = re.compile(r"(?:node_id|Node ID|Node Id|node ID|NodeID)[:=]?\s*'?([0-9a-f]{16,})", re.IGNORECASE)
_NODE_IP = re.compile(r"(?:node_ip_address|node IP|IP)[:=]?\s*'?(\d{1,3}(?:\.\d{1,3}){3})", re.IGNORECASE)


def _chain(exc: BaseException):
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def lost_error(exc: BaseException) -> BaseException | None:
    """The Ray error of a lost actor, node or owner in ``exc``'s chain, else None."""
    errors = sys.modules.get("ray.exceptions")
    if errors is None:
        return None
    kinds = tuple(getattr(errors, name) for name in LOSS_ERRORS if hasattr(errors, name))
    return next((e for e in _chain(exc) if isinstance(e, kinds)), None)


def lost_node(error: BaseException) -> str | None:
    """The node of the lost actor (its id, shortened, else its IP): named by Ray's error, else the node the GCS's
    actor table places the actor on (an ``ActorUnavailableError``, raised before the node is marked dead, names
    none), if this process is connected to the cluster; None when neither says."""
    text = str(error)
    found = _NODE.search(text)
    if found:
        return found.group(1)[:12]
    found = _NODE_IP.search(text)
    if found:
        return found.group(1)
    actor_id = getattr(error, "actor_id", None)
    ray = sys.modules.get("ray")
    if not actor_id or ray is None or not ray.is_initialized():
        return None
    try:
        from ray._private.state import actors  # the GCS's actor table; Ray's state API needs the dashboard

        node = (actors(actor_id).get("Address") or {}).get("NodeID")
    except Exception:  # naming the node is a courtesy: the loss is told without it
        return None
    return node[:12] if node else None


def lost_actors(exc: BaseException) -> str | None:
    """What was lost, e.g. ``its Ray actors were lost with node 3f2a9c0d1e4b (ActorDiedError)``; None when
    ``exc`` is not the loss of Ray actors."""
    error = lost_error(exc)
    if error is None:
        return None
    node = lost_node(error)
    where = f"with node {node}" if node else "with their node or worker process"
    return f"its Ray actors were lost {where} ({type(error).__name__})"


def get_naming_the_lost(ray: Any, refs: list, wait_s: float = PEER_LOSS_WAIT_S) -> list:
    """``ray.get(refs)`` of one call to each of a group of actors that run collectives together (data-parallel
    learners). When a node dies, a surviving actor's collective usually fails first ("Connection closed by peer")
    and ``ray.get`` raises that ``RayTaskError``; the cause is the peer's loss, whose ``RayActorError`` arrives a
    moment later. So on a failure, the other calls are given up to ``wait_s`` to end, and a lost actor's error is
    raised (from the first error) if there is one: the loss is what the caller sees, not its symptom."""
    try:
        return ray.get(refs)
    except Exception as exc:
        lost = lost_among(ray, refs, wait_s)
        if lost is None:
            raise
        raise lost from exc


def lost_among(ray: Any, refs: list, wait_s: float) -> BaseException | None:
    """The error of a lost actor (or process of this machine) among ``refs`` (waiting up to ``wait_s`` for them
    to end), else None."""
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)
    for ref in done:
        try:
            ray.get(ref)
        except Exception as exc:
            if lost_error(exc) is exc or isinstance(exc, ProcessLost):
                return exc
    return None
