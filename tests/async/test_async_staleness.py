"""The staleness accounting of asynchronous rollouts, against hand-computed values."""

import pytest

from openrft.engine.staleness import StalenessManager


def test_admission_bound_is_tolerance_plus_one_batches_ahead_of_training():
    s = StalenessManager(batch_size=4, age_tolerance=1)
    assert s.capacity() == 8  # (1 + 1 + 0) * 4
    assert s.admit(5) == 5
    assert s.admit(5) == 3  # only 8 - 5 left
    assert s.admit(1) == 0
    s.finish(8)
    assert (s.running, s.ready) == (0, 8)
    assert all(s.take(policy_version=0) for _ in range(4))
    assert s.capacity() == 0  # consumed groups hold their slots until the batch is trained
    s.batch_trained(version=1)
    assert s.limit == 12 and s.capacity() == 4


def test_tolerance_zero_admits_exactly_one_batch_per_update():
    s = StalenessManager(batch_size=3, age_tolerance=0)
    for version in range(4):
        assert s.admit(10) == 3
        assert s.admit(1) == 0
        s.finish(3)
        assert [s.take(version) for _ in range(3)] == [True, True, True]
        assert s.capacity() == 0
        s.batch_trained(version + 1)
    assert s.ages == {0: 12} and s.dropped == 0


def test_drop_rule_and_freed_slot():
    # three batches trained (6 groups consumed), policy version 3
    s = StalenessManager(batch_size=2, age_tolerance=1, version=3, trained=3, consumed=6)
    assert s.age(2) == 1 and not s.is_stale(2)
    assert s.age(1) == 2 and s.is_stale(1)
    assert s.limit == 10 and s.admit(8) == 4  # (1 + 1 + 3) * 2 - 6
    s.finish(2)
    assert s.take(policy_version=1) is False  # age 2 > 1: dropped, not consumed
    assert (s.dropped, s.consumed, s.ready, s.running) == (1, 6, 1, 2)
    assert s.capacity() == 1  # the dropped group's slot is free again for its regeneration
    assert s.take(policy_version=2) is True
    assert s.ages == {1: 1} and s.consumed == 7


def test_step_without_update_still_moves_the_window():
    s = StalenessManager(batch_size=2, age_tolerance=0)
    s.admit(2)
    s.finish(2)
    s.take(0), s.take(0)
    s.batch_trained(0)  # every reward failed: no update, the version stays
    assert s.version == 0 and s.trained == 1 and s.admit(5) == 2


def test_versions_never_go_back_and_counts_stay_consistent():
    s = StalenessManager(batch_size=2, age_tolerance=0, version=2)
    with pytest.raises(RuntimeError, match="went back"):
        s.batch_trained(1)
    with pytest.raises(RuntimeError, match="finish"):
        s.finish(1)
    with pytest.raises(RuntimeError, match="take"):
        s.take(2)
    s.admit(1)
    s.abandon(1)
    assert s.running == 0 and s.capacity() == 2
    with pytest.raises(ValueError, match="batch_size"):
        StalenessManager(batch_size=0, age_tolerance=0)


def test_state_round_trip_forgets_work_in_flight():
    s = StalenessManager(batch_size=2, age_tolerance=2)
    s.admit(6)
    s.finish(3)
    for _ in range(2):
        s.take(0)
    s.batch_trained(1)
    restored = StalenessManager(batch_size=2, age_tolerance=2)
    restored.load_state_dict(s.state_dict())
    assert (restored.version, restored.trained, restored.consumed) == (1, 1, 2)
    assert restored.running == restored.ready == 0
    assert restored.capacity() == (2 + 1 + 1) * 2 - 2
