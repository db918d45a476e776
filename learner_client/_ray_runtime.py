"""Ray's lifetime in this process: imported on demand, started by a fleet, stopped by the last.

A fleet placed on Ray (:class:`~learner_client._ray_fleet.RayFleet`, also the one a
RayCollector drop-in collector places) takes a :class:`RayLease` while it runs: Ray started by
one of them stops with the last, as TorchRL's own Ray users count theirs. Its Ray actors belong
to the Ray connection it was placed in (:func:`ray_session`): after the script's own
``ray.shutdown()`` they are gone, also once the script calls ``ray.init()`` again. Ray is
imported here only when a fleet needs it (the ``rlfleet[ray]`` extra).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["RAY_EXTRA", "RayLease", "import_ray", "ray_session", "shut_down_ray_when_unused"]

#: What to install for a fleet placed on Ray.
RAY_EXTRA = "pip install 'rlfleet[ray]'"


def import_ray() -> Any:
    """``ray``, or an ``ImportError`` naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"placing actors on Ray needs Ray, which is not installed ({exc}): {RAY_EXTRA}"
        ) from exc
    return ray


class RayLease:
    """This process's fleets that use Ray: Ray started by one of them stops with the last.

    As TorchRL's own Ray users count theirs: a fleet (or collector) that stops while others
    still use Ray leaves it running for them; the last one shuts it down if a fleet started
    it, or if one of them asked to (``shutdown_ray``). The count is of one Ray connection
    (:func:`ray_session`): after the script's own ``ray.shutdown()`` and ``ray.init()``, a
    lease of the gone connection is let go without stopping the script's new Ray.
    """

    _lock = threading.Lock()
    _leases = 0
    _shut_down_at_end = False
    _session: str | None = None  # the Ray connection the two above count for

    @classmethod
    def acquire(cls, init_config: Mapping[str, Any]) -> Any:
        """Ray, initialised with ``init_config`` if it is not yet; one more lease held."""
        ray = import_ray()
        with cls._lock:
            started = not ray.is_initialized()
            if started:
                config = dict(init_config)
                if config.get("address") is None:
                    config.setdefault("include_dashboard", False)
                ray.init(**config)
            cls._follow()
            cls._shut_down_at_end |= started
            cls._leases += 1
        return ray

    @classmethod
    def request_shutdown(cls) -> None:
        """Shut Ray down now if no fleet holds a lease, else when the last lets go."""
        import ray

        with cls._lock:
            cls._follow()
            cls._shut_down_at_end = cls._leases > 0
            if cls._leases == 0 and ray.is_initialized():
                ray.shutdown()

    @classmethod
    def release(cls, shutdown_ray: bool, session: str | None) -> None:
        """One lease of ``session`` less; Ray shuts down with the last if a fleet started it.

        Or if one asked (``shutdown_ray``). A lease of a gone connection changes nothing: the
        Ray it was of is gone, and the one up now is another's.
        """
        import ray

        with cls._lock:
            cls._follow()
            if session is None or session != cls._session:
                return
            cls._leases = max(0, cls._leases - 1)
            cls._shut_down_at_end |= shutdown_ray
            if cls._leases == 0 and cls._shut_down_at_end:
                cls._shut_down_at_end = False
                if ray.is_initialized():
                    ray.shutdown()

    @classmethod
    def _follow(cls) -> None:
        """Count afresh once Ray is another connection than the one counted (or is down)."""
        now = ray_session()
        if now != cls._session:
            cls._session, cls._leases, cls._shut_down_at_end = now, 0, False


def shut_down_ray_when_unused() -> None:
    """RayCollector's ``shutdown(shutdown_ray=True)``: Ray stops now, or with the last fleet.

    Nothing when Ray was never imported (a collector of actors given by address).
    """
    if "ray" in sys.modules:
        RayLease.request_shutdown()


def ray_session() -> str | None:
    """This process's connection to Ray now (its cluster's session, its job); None when down.

    A call on a handle after ``ray.shutdown()`` would start a new local Ray, not fail; after
    the script's ``ray.init()`` again, Ray is up but the handles are of the gone connection,
    whose actors died with it (a call raises Ray's bare ``Exception``).
    """
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()  # a new cluster's first job has the old one's id
    return f"{context.get_session_name()}/{context.get_job_id()}"
