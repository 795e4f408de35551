"""A Ray cluster of the test module's own on this machine (``address="local"``: never one that else runs here)."""

from __future__ import annotations

from collections.abc import Iterator


def own_ray_cluster(num_cpus: int, **init) -> Iterator[None]:
    """Start it for a fixture (``yield from own_ray_cluster(4)``), shut it down after."""
    import ray

    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        logging_level="ERROR",
        **{"log_to_driver": False, **init},
    )
    yield
    ray.shutdown()
