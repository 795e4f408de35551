"""The engine's thread count for a machine: physical cores, capped by the cores other processes leave idle."""

from openrft.models import default_threads


def test_one_thread_per_physical_core_on_an_idle_machine():
    assert default_threads(physical=2, logical=2, load=0.1) == 2
    assert default_threads(physical=32, logical=64, load=3.0) == 32  # hyper-threads are not counted


def test_busy_machine_gets_fewer_threads_never_none():
    assert default_threads(physical=2, logical=2, load=9.0) == 1
    assert default_threads(physical=8, logical=8, load=5.2) == 3
    assert default_threads(physical=4, logical=8, load=100.0) == 1
