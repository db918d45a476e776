"""Smoke tests of the benchmarks: every script runs end to end and ends with its JSON line.

One ``python -m bench.run_all --quick`` run (every script with a tiny budget,
each in its own process, real actors and real TorchRL workers) feeds the
per-script checks; timings are never asserted, only the shape of the output.
The harness arithmetic is checked directly.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench._common import Report, pairwise_ratios, slope
from bench._loopback import LoopbackReceivers
from bench.run_all import BENCHES
from tests.helpers import poll_until, process_alive

ROOT = Path(__file__).resolve().parents[2]

# Figures and ratios each script must report in quick mode.
EXPECTED = {
    "cartpole": (
        [
            "rlfleet sync",
            "rlfleet sync prefetch=1",
            "rlfleet async",
            "rlfleet user sync",
            "rlfleet user sync prefetch=1",
            "rlfleet user sync prefetch=2",
            "torchrl sync",
            "torchrl async",
            "torchrl user sync",
            "in-process limit",
            "in-process limit (user policy)",
            "parallel in-process loops",
        ],
        [
            "rlfleet/torchrl sync",
            "rlfleet/torchrl async",
            "rlfleet sync/in-process limit",
            "rlfleet sync prefetch=1/torchrl sync",
            "rlfleet/torchrl user sync",
            "rlfleet user sync/in-process limit (user policy)",
            "rlfleet user sync prefetch=1/in-process limit (user policy)",
            "rlfleet user sync prefetch=2/in-process limit (user policy)",
            "rlfleet user sync/in-process limit",
            "parallel in-process loops/in-process limit (user policy)",
            "rlfleet user sync prefetch=2/parallel in-process loops",
        ],
    ),
    "codec": (
        [
            f"{case} {key}"
            for case in ("pixels", "cartpole")
            for key in ("codec", "codec crc32c", "clone", "copy warm", "codec frames/s")
        ],
        [
            f"{case} {key}/clone"
            for case in ("pixels", "cartpole")
            for key in ("codec", "codec crc32c")
        ],
    ),
    "torchrl_envs": (
        [
            "rlfleet frames/s",
            "rlfleet CPU us/frame",
            "torchrl frames/s",
            "torchrl CPU us/frame",
        ],
        ["rlfleet/torchrl", "CPU/frame rlfleet/torchrl"],
    ),
    "one_env": (
        ["torchrl", "torchrl pooled", "rlfleet"],
        ["rlfleet/torchrl", "torchrl pooled/torchrl", "rlfleet/torchrl pooled"],
    ),
    "large_obs": (
        [
            "rlfleet frames",
            "rlfleet payload",
            "rlfleet bytes frames",
            "rlfleet prefetch=2 frames",
            "torchrl frames",
            "torchrl payload",
            "loopback tcp",
            "in-process limit frames",
            "parallel in-process loops frames",
            "wire bytes per frame",
        ],
        [
            "rlfleet/torchrl frames",
            "rlfleet/in-process limit frames",
            "rlfleet prefetch=2/in-process limit frames",
            "rlfleet/parallel loops frames",
            "shared memory/bytes frames",
            "wire/payload bytes",
        ],
    ),
    "learner_cost": (
        [
            "pixels frames/s",
            "pixels cpu s per Mframes",
            "pixels cpu s per GB",
            "pixels GB/s per core",
            "replay pixels frames/s",
            "replay pixels cpu s per Mframes",
            "replay cartpole frames/s",
            "replay cartpole cpu s per Mframes",
            "replay cartpole async frames/s",
            "replay cartpole async cpu s per Mframes",
        ],
        [],
    ),
    "weight_push": (
        [
            "tiny rlfleet",
            "tiny rlfleet bytes",
            "tiny rlfleet relayed",
            "tiny torchrl multisync",
            "tiny raw loopback",
        ],
        [
            "tiny rlfleet/raw loopback",
            "tiny rlfleet bytes/raw loopback",
            "tiny rlfleet relayed/raw loopback",
            "tiny rlfleet/torchrl multisync",
        ],
    ),
    "push_forms": (
        [
            "tiny full",
            "tiny full bytes",
            "tiny full pause",
            "tiny full raw",
            "tiny full collecting",
            "tiny delta adam",
            "tiny delta 1%",
            "tiny delta bf16 adam 1e-05 bytes",
        ],
        [
            "tiny full/raw",
            "tiny full pause/push",
            "tiny delta 1% bytes/full",
            "tiny delta bf16 adam 1e-05 bytes/bf16",
        ],
    ),
    "sharded_push": (
        ["one rank", "one rank pause", "two ranks", "two ranks pause"],
        ["two ranks/one rank", "two ranks pause/one rank pause"],
    ),
    "push_streams": (
        ["1 stream", "2 streams", "4 streams", "raw loopback"],
        [
            "1 stream/raw loopback",
            "4 streams/raw loopback",
            "2 streams/1 stream",
            "4 streams/1 stream",
        ],
    ),
    "llm_push": (
        [
            "llm 25m full",
            "llm 25m full raw",
            "llm 25m full generating pause",
            "llm 25m bf16 bytes",
            "llm 25m delta bf16 adam 1e-6 bytes",
            "llm 25m adapter bytes",
        ],
        [
            "llm 25m full/raw",
            "llm 25m full generating pause/push",
            "llm 25m delta bf16 adam 1e-6 bytes/full",
            "llm 25m adapter bytes/full",
        ],
    ),
    "startup": (["rlfleet sync", "torchrl sync"], ["rlfleet/torchrl sync"]),
    "sync_round": (
        [
            "rlfleet tiny round",
            "rlfleet tiny learner cpu",
            "rlfleet tiny actor cpu",
            "torchrl tiny round",
            "rlfleet cartpole round",
            "rlfleet cartpole learner cpu",
            "in-process cartpole round",
        ],
        ["rlfleet/torchrl tiny round", "rlfleet cartpole round/in-process"],
    ),
    "metrics": (
        ["metrics off", "metrics on", "loop metrics off", "loop metrics on"],
        ["metrics on/off", "loop metrics on/off"],
    ),
    "llm_tokens": (
        [
            "in-process generate (1 core)",
            "rlfleet fleet",
            "rlfleet per actor",
            "rlfleet prefetch=2 per actor",
            "torchrl LLMCollector",
        ],
        ["per actor / in-process", "per actor / in-process, prefetch=2", "fleet / torchrl"],
    ),
    "memory": (
        ["learner rss growth", "learner rss slope", "actor 0 rss growth", "frames collected"],
        [],
    ),
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run_all", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"run_all printed nothing; stderr:\n{proc.stderr[-3000:]}"
    final = json.loads(lines[-1])
    assert proc.returncode == 0, f"run_all failed: {final.get('failed')}\n{proc.stdout[-3000:]}"
    return final, out


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_run_all_ends_with_a_json_line_covering_every_script(quick_run):
    final, out = quick_run
    assert final["bench"] == "run_all"
    assert final["quick"] is True
    assert final["failed"] == []
    assert sorted(final["results"]) == sorted(BENCHES)
    assert sorted(p.stem for p in out.glob("*.json")) == sorted(BENCHES)
    for target in final["targets"]:
        assert {"bench", "name", "value", "threshold", "met", "higher_is_better"} <= set(target)


@pytest.mark.slow
@pytest.mark.timeout(960)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bench_script_prints_expected_fields(quick_run, name):
    _, out = quick_run
    payload = json.loads((out / f"{name}.json").read_text())
    assert payload["bench"] == name
    assert payload["quick"] is True
    fields = {"figures", "ratios", "targets", "skipped", "notes", "machine", "elapsed_s"}
    assert fields <= set(payload)
    figures, ratios = EXPECTED[name]
    for key in figures:
        figure = payload["figures"][key]
        assert figure["samples"], key
        assert math.isfinite(figure["median"]), key
        assert figure["unit"], key
    for key in ratios:
        ratio = payload["ratios"][key]
        assert ratio["median"] > 0, key
        assert ratio["samples"], key
    assert payload["targets"], f"{name} reports no target"
    for target in payload["targets"]:
        assert isinstance(target["met"], bool)
        assert math.isfinite(target["value"])
    assert payload["machine"]["nproc"] >= 1


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_weight_push_skips_ray_with_a_reason_in_quick_mode(quick_run):
    _, out = quick_run
    payload = json.loads((out / "weight_push.json").read_text())
    assert payload["skipped"]["ray"]
    forms = json.loads((out / "push_forms.json").read_text())
    assert forms["skipped"]["tiny adapter"]


def test_pairwise_ratios_pairs_repetitions():
    assert pairwise_ratios([10.0, 20.0, 30.0], [5.0, 5.0, 10.0]) == [2.0, 4.0, 3.0]
    # Different counts fall back to the ratio of medians.
    assert pairwise_ratios([10.0, 30.0], [5.0]) == [4.0]


def test_slope_fits_a_line():
    assert slope([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0]) == pytest.approx(2.0)
    assert slope([1.0], [5.0]) == 0.0


def test_report_emit_prints_table_then_json_last(capsys):
    report = Report("demo", quick=True)
    report.figure("a", "frames/s", [30.0, 10.0, 20.0])
    report.figure("b", "frames/s", [10.0, 10.0, 10.0])
    ratio = report.ratio("a/b", "a", "b")
    report.target("a >= 2x b", ratio, 2.0)
    report.target("a/b <= 1", ratio, 1.0, higher_is_better=False)
    report.emit()
    lines = capsys.readouterr().out.strip().splitlines()
    payload = json.loads(lines[-1])
    assert payload["figures"]["a"]["median"] == 20.0
    assert payload["ratios"]["a/b"]["median"] == 2.0
    assert [t["met"] for t in payload["targets"]] == [True, False]
    assert any("NOT MET" in line for line in lines[:-1])


def test_loopback_receivers_transfer_acks_every_receiver():
    with LoopbackReceivers(2) as rx:
        seconds = rx.transfer(memoryview(bytearray(1_000_000)))
        assert seconds > 0
        # The connections stay usable: a second message of another size goes through.
        assert rx.transfer(memoryview(bytearray(10))) > 0


# A script that records its pid and then runs far longer than any test waits.
_SLOW_SCRIPT = """
import os, sys, time
with open(sys.argv[-1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_run_all_stops_the_running_script_on_ctrl_c_or_sigterm(tmp_path, signum):
    (tmp_path / "slow_script.py").write_text(_SLOW_SCRIPT)
    pid_file = tmp_path / "pid"
    driver = (
        "import sys, bench.run_all as r; r.BENCHES['slow'] = 'slow_script'; "
        f"r.flags_for = lambda name, args: [{str(pid_file)!r}]; "
        "sys.exit(r.main(['--only', 'slow']))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", driver], cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    try:
        poll_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=30)
        script = int(pid_file.read_text())
        # Ctrl-C (or `timeout`) signals run_all: the script, in a session of its own, gets nothing.
        proc.send_signal(signum)
        assert proc.wait(timeout=30) != 0
        poll_until(lambda: not process_alive(script), timeout=10, message="script left running")
    finally:
        proc.kill()
        proc.wait()
        if pid_file.exists() and pid_file.read_text() and process_alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    "script", ["cartpole", "large_obs", "learner_cost", "metrics_overhead", "one_env"]
)
@pytest.mark.parametrize("flags", [["--window", "0"], ["--window", "-1"], ["--reps", "0"]])
def test_bench_parse_args_raises_if_window_or_reps_measure_nothing(script, flags, capsys):
    module = __import__(f"bench.{script}", fromlist=["parse_args"])
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--quick", *flags])
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_codec_bench_raises_if_reps_is_zero(capsys):
    from bench import codec_bench

    with pytest.raises(SystemExit) as exit_info:
        codec_bench.main(["--quick", "--reps", "0"])
    assert exit_info.value.code == 2
    assert "--reps must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--reps", "0"], ["--timeout", "0"], ["--timeout", "-5"]])
def test_run_all_raises_if_reps_or_timeout_runs_nothing(flags, capsys):
    from bench import run_all

    with pytest.raises(SystemExit) as exit_info:
        run_all.parse_args(["--only", "codec", *flags])
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "flags"),
    [
        ("weight_push", ["--sizes", "2M"]),
        ("push_forms", ["--llm", "1b"]),
        ("llm_push", ["--shapes", "25m,1b"]),
        ("learner_cost", ["--mode", "pixel"]),
    ],
)
def test_bench_parse_args_raises_if_a_name_is_unknown(script, flags, capsys):
    module = __import__(f"bench.{script}", fromlist=["parse_args"])
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--quick", *flags])
    assert exit_info.value.code == 2
    assert f"unknown {flags[0]}" in capsys.readouterr().err


def test_memory_parse_args_raises_if_push_every_is_zero(capsys):
    from bench import memory

    with pytest.raises(SystemExit) as exit_info:
        memory.parse_args(["--quick", "--push-every", "0"])
    assert exit_info.value.code == 2
    assert "--push-every" in capsys.readouterr().err
