"""TorchRL's own training scripts on a fleet, with only their collector line changed.

For each script of ``bench/torchrl_scripts/_specs.py`` (originals from the installed torchrl
0.14.1 wheel; the tutorials from a pytorch/rl checkout named by ``RLFLEET_TORCHRL_SOURCE``,
skipped without one):

- the port differs from TorchRL's file only in the statement that builds the collector
  (plus its imports and header), and a port that changed anything else is caught;
- the port runs end to end at a tiny budget (a few batches) on a real ``LocalFleet`` of
  actors (``ScriptSpec.actors``) running the script's own env and policy factories (fast suite);
- at the comparison budget (slow), the port's final return is within 20% of the same
  script on TorchRL's own collector, or both reach the task's threshold.
"""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("torchrl")
pytest.importorskip("hydra")

from bench.torchrl_scripts._port import PortError, check_port, collector_call, port_source
from bench.torchrl_scripts._run import missing_needs, original, originals_root, run_script
from bench.torchrl_scripts._specs import SPECS, ScriptSpec
from bench.torchrl_scripts.compare import within_criterion

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
    ported = port_source(source, spec.fleet_args())
    assert check_port(source, ported) == []
    assert "GrpcCollector(\n" in ported
    assert "fleet.addresses" in ported
    # The check is not vacuous: one changed argument and one changed line elsewhere.
    found = collector_call(source)
    keyword = found.call.keywords[0]
    at = ported.index("GrpcCollector(\n")
    tampered = ported[:at] + ported[at:].replace(f"{keyword.arg}=", f"{keyword.arg}=1 + ", 1)
    assert any("differs from the original" in p for p in check_port(source, tampered))
    edited = ported.rstrip("\n") + "  # edited\n"  # the file's last line: not the collector
    assert any("outside the collector" in p for p in check_port(source, edited))


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


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_torchrl_script_on_a_fleet_returns_as_on_torchrl(name: str, tmp_path: pathlib.Path) -> None:
    spec = _spec(name, to_run=True)
    ours = run_script(spec, "fleet", spec.bench, tmp_path / "fleet", timeout=1800)
    theirs = run_script(spec, "torchrl", spec.bench, tmp_path / "torchrl", timeout=1800)
    assert ours.returncode == 0, ours.log_tail
    assert theirs.returncode == 0, theirs.log_tail
    assert within_criterion(spec, ours.final_return, theirs.final_return), (
        ours.final_return,
        theirs.final_return,
    )
