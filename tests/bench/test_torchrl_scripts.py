"""TorchRL's own training scripts on a fleet, with only their collector line changed.

For each script of ``bench/torchrl_scripts/_specs/`` (originals from the installed torchrl
0.14.1 wheel; the tutorials and main's ``dreamer_v3.py`` from a pytorch/rl checkout named by
``RLFLEET_TORCHRL_SOURCE``, skipped without one):

- the port differs from TorchRL's file only in the statement that builds the collector
  (plus its imports and header), and a port that changed anything else is caught;
- the port runs end to end at a tiny budget (a few batches) on a real ``LocalFleet`` of
  actors (``ScriptSpec.actors``) running the script's own env and policy factories (fast suite);
- at the comparison budget (slow), the median of the port's final returns over three runs
  is within 20% of the same script's on TorchRL's own collector, or both reach the task's
  threshold.
"""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

pytest.importorskip("torchrl")
pytest.importorskip("hydra")

from bench.torchrl_scripts._driver import COLLECTION_FILE
from bench.torchrl_scripts._port import PortError, check_port, collector_call, port_source
from bench.torchrl_scripts._run import missing_needs, original, originals_root, run_script
from bench.torchrl_scripts._specs import SPECS, ScriptSpec
from bench.torchrl_scripts.compare import compare, within_criterion

pytestmark = pytest.mark.long

NAMES = [
    pytest.param(name, marks=[pytest.mark.torchvision]) if "torchvision" in spec.needs else name
    for name, spec in sorted(SPECS.items())
]


def _spec(name: str, *, to_run: bool = False) -> ScriptSpec:
    spec = SPECS[name]
    if originals_root(spec) is None:
        pytest.skip(f"{spec.folder}/{spec.script} is not on this machine")
    if to_run and missing_needs(spec):
        pytest.skip(missing_needs(spec))
    return spec


@pytest.mark.parametrize("name", NAMES)
def test_torchrl_script_port_changes_only_the_collector(name: str) -> None:
    spec = _spec(name)
    source = original(spec, spec.collector_file)
    ported = port_source(source, spec.fleet_args(), spec.collector_call)
    assert check_port(source, ported, spec.collector_call) == []
    assert "GrpcCollector(\n" in ported
    assert "GrpcCollector(\n    fleet,\n" in ported.replace("        ", "    ")  # the fleet itself
    (fleet_line,) = [line for line in ported.splitlines() if "fleet = LocalFleet(" in line]
    assert ".start()" not in fleet_line  # the collector starts it and stops it at shutdown()
    # The check is not vacuous: one changed argument and one changed line elsewhere.
    new = collector_call(ported, "GrpcCollector")
    keyword = next(k for k in new.call.keywords if k.arg != "sync")
    at = ported.index("GrpcCollector(\n")
    changed = ported[at:].replace(f"    {keyword.arg}=", f"    {keyword.arg}=1 + ", 1)
    tampered = ported[:at] + changed
    assert tampered != ported
    problems = check_port(source, tampered, spec.collector_call)
    assert any("differs from the original" in p for p in problems)
    edited = ported.rstrip("\n") + "  # edited\n"  # the file's last line: not the collector
    assert any(
        "outside the collector" in p for p in check_port(source, edited, spec.collector_call)
    )


_HELPER_SCRIPT = """from torchrl.trainers.helpers import sync_async_collector, sync_sync_collector


def make_collector(cfg, make_env, policy):
    collector_helper = sync_async_collector if cfg.asynchronous else sync_sync_collector
    collector_helper_kwargs = {
        "env_fns": make_env,
        "env_kwargs": {},
        "policy": policy,
        "frames_per_batch": cfg.frames_per_batch,
        "num_env_per_collector": 1,
        "num_collectors": 2,
    }
    collector = collector_helper(**collector_helper_kwargs)
    return collector
"""


def test_torchrl_script_port_of_a_collector_helper_passes_its_kwargs_by_collector_names() -> None:
    ported = port_source(_HELPER_SCRIPT, "2", "collector_helper")
    assert check_port(_HELPER_SCRIPT, ported, "collector_helper") == []
    call = collector_call(ported, "GrpcCollector").call
    assert [ast.unparse(arg) for arg in call.args] == ["fleet"]
    # sync from the helper (sync_sync_collector: MultiSyncCollector), keys by Collector's
    # names, and the env layout (env_kwargs, num_env_per_collector, num_collectors) left out.
    assert {k.arg: ast.unparse(k.value) for k in call.keywords} == {
        "sync": "collector_helper is sync_sync_collector",
        "create_env_fn": "collector_helper_kwargs['env_fns']",
        "policy": "collector_helper_kwargs['policy']",
        "frames_per_batch": "collector_helper_kwargs['frames_per_batch']",
    }


def test_torchrl_script_port_of_a_collector_helper_raises_without_a_dict_literal() -> None:
    head, rest = _HELPER_SCRIPT.split("    collector_helper_kwargs = {")
    by_name = head + "    collector_helper_kwargs = kwargs_of(cfg)\n" + rest.split("    }\n", 1)[1]
    with pytest.raises(PortError, match="one dict literal assigned to collector_helper_kwargs"):
        port_source(by_name, "2", "collector_helper")
    positional = _HELPER_SCRIPT.replace("(**collector_helper_kwargs)", "(make_env, policy)")
    with pytest.raises(PortError, match=r"expected collector_helper\(\*\*kwargs\)"):
        port_source(positional, "2", "collector_helper")


def test_torchrl_script_port_raises_if_no_collector_is_built() -> None:
    with pytest.raises(PortError, match="expected one call to Collector"):
        port_source("import torch\nx = 1\n", "2")


@pytest.mark.parametrize("name", NAMES)
def test_torchrl_script_runs_on_a_fleet(name: str, tmp_path: pathlib.Path) -> None:
    spec = _spec(name, to_run=True)
    result = run_script(spec, "fleet", spec.smoke, tmp_path / name, timeout=240)
    assert result.returncode == 0, result.log_tail
    ported = (tmp_path / name / spec.collector_file).read_text()
    assert "GrpcCollector(" in ported
    # The script's waits on its collector were timed: at least two batches, some seconds.
    waited = json.loads((tmp_path / name / COLLECTION_FILE).read_text())
    assert waited["batches"] >= 2, waited
    assert 0 < waited["collection_s"] == result.collection_s < result.wall_s
    assert 0 < waited["first_batch_s"] == result.first_batch_s < result.collection_s


def _find(payload: object, key: str) -> object:
    """The first value under ``key`` in nested mappings, lists and attribute holders."""
    items = payload.items() if isinstance(payload, dict) else []
    if isinstance(payload, dict) and key in payload:
        return payload[key]
    children = [v for _, v in items] + (list(payload) if isinstance(payload, list | tuple) else [])
    children += list(vars(payload).values()) if hasattr(payload, "__dict__") else []
    for child in children:
        found = _find(child, key)
        if found is not None:
            return found
    return None


def test_ppo_mujoco_checkpoint_on_a_fleet_holds_vecnorm_and_loads_in_rlrender(
    tmp_path: pathlib.Path,
) -> None:
    """The script's final checkpoint reads ``get_vecnorm_state(train_env)`` of the learner's env."""
    spec = _spec("ppo_mujoco", to_run=True)
    render = pytest.importorskip("torchrl.render.checkpoint")
    path = tmp_path / "ppo.pt"
    overrides = (*spec.smoke, f"checkpoint.path={path}")
    result = run_script(spec, "fleet", overrides, tmp_path / "run", timeout=240)
    assert result.returncode == 0, result.log_tail
    vecnorm = _find(render.load_checkpoint(path), "vecnorm")
    assert isinstance(vecnorm, dict), vecnorm
    assert set(vecnorm) == {"loc", "scale"}
    assert vecnorm["loc"].shape == vecnorm["scale"].shape
    assert bool((vecnorm["scale"] > 0).all())


#: Runs a side in the comparison below, and the longest each may take.
COMPARED_RUNS, RUN_TIMEOUT_S = 3, 1800


@pytest.mark.slow
@pytest.mark.timeout(2 * COMPARED_RUNS * RUN_TIMEOUT_S + 60)  # the suite's 300 s is one run's
@pytest.mark.parametrize("name", NAMES)
def test_torchrl_script_on_a_fleet_returns_as_on_torchrl(name: str, tmp_path: pathlib.Path) -> None:
    spec = _spec(name, to_run=True)
    if not spec.compared:
        pytest.skip(f"{spec.script} has no comparison budget")
    row = compare(spec, tmp_path, runs=COMPARED_RUNS, timeout=RUN_TIMEOUT_S)
    assert row["ok"], row


def test_criterion_is_twenty_percent_or_both_at_the_threshold() -> None:
    spec = SPECS["dqn_cartpole"]  # threshold 475
    assert within_criterion(spec, 100.0, 120.0)
    assert not within_criterion(spec, 90.0, 120.0)
    assert not within_criterion(spec, 150.0, 120.0)  # ahead by more than 20%: not the same
    assert within_criterion(spec, 500.0, 480.0)
    assert not within_criterion(spec, None, 120.0)
    assert within_criterion(SPECS["mappo_ippo"], -11.0, -10.0)  # negative returns
