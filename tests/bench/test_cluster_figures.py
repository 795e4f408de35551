"""The cluster benchmark's figures (benchmarks/cluster.py), against hand-computed values: max-min fair shares, the
fairness index of tenants' CPU-seconds over their fair shares, and the makespan."""

from __future__ import annotations

import pytest

from benchmarks.cluster import CLUSTER_CPUS, held_against_fair_share, jain, makespan, max_min_shares


def job(tenant: str, created: float, started: float, finished: float) -> dict:
    return {"tenant": tenant, "created": created, "started": started, "finished": finished, "cpu": 1.0}


def test_max_min_shares_split_evenly_and_give_what_one_cannot_use_to_the_other():
    assert max_min_shares({"a": 6, "b": 2}, 4) == {"a": 2, "b": 2}
    assert max_min_shares({"a": 6, "b": 1}, 4) == {"a": 3, "b": 1}
    assert max_min_shares({"a": 1, "b": 1}, 4) == {"a": 1, "b": 1}
    assert max_min_shares({"a": 0, "b": 5}, 4) == {"a": 0, "b": 4}


def test_jain_index_is_one_for_equal_and_one_over_n_for_all_to_one():
    assert jain([1.0, 1.0]) == 1.0
    assert jain([2.0, 0.0]) == 0.5
    assert jain([2.0, 1.0]) == pytest.approx(9 / 10)


def test_the_fair_order_scores_one_and_arrival_order_scores_a_half():
    """Four CPUs, A's four jobs and B's two queued at 0, each running 10 s. Sharing: A two and B two at once
    (then A's other two): each held its fair share. Arrival order: A's four first, B waits 10 s: while both had
    work (0 to 10 s) A held 4 CPUs against a fair 2 and B none against 2."""
    assert CLUSTER_CPUS == 4
    fair = [job("a", 0, 0, 10)] * 2 + [job("b", 0, 0, 10)] * 2 + [job("a", 0, 10, 20)] * 2
    shares = held_against_fair_share(fair)
    assert shares == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}
    assert jain(list(shares.values())) == pytest.approx(1.0)
    in_order = [job("a", 0, 0, 10)] * 4 + [job("b", 0, 10, 20)] * 2
    shares = held_against_fair_share(in_order)
    assert shares == {"a": pytest.approx(2.0), "b": pytest.approx(0.0)}
    assert jain(list(shares.values())) == pytest.approx(0.5)
    assert makespan(in_order) == 20
