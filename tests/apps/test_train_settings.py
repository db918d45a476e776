"""The reference learner's settings (its command line) and its run outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import math
import resource
import signal
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from apps._job.report import Progress, save_weights_and_summary
from apps.ppo._report import TrainSummary, plot_learning_curve, save_run
from apps.ppo._settings import TrainSettings, parse_args
from common.weights import decode_weights


def test_parse_args_defaults_equal_the_dataclass_defaults():
    assert parse_args([]) == TrainSettings()


def test_parse_args_reads_every_kind_of_flag():
    settings = parse_args(
        [
            "--env",
            "Pendulum-v1",
            "--async",
            "--num-actors",
            "3",
            "--num-envs",
            "4",
            "--frames-per-batch",
            "400",
            "--hidden",
            "32,16",
            "--lr",
            "1e-3",
            "--no-anneal-lr",
            "--target-return",
            "-200",
            "--no-progress",
        ]
    )
    assert settings.env == "Pendulum-v1"
    assert settings.sync is False
    assert (settings.num_actors, settings.num_envs, settings.frames_per_batch) == (3, 4, 400)
    assert settings.hidden == (32, 16)
    assert settings.lr == 1e-3
    assert settings.anneal_lr is False
    assert settings.effective_target_return == -200.0
    assert settings.progress is False
    assert parse_args(["--actors", "a:1,b:2"]).actors == ("a:1", "b:2")


def test_parse_args_raises_if_sync_and_async_are_both_given(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--sync", "--async"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-actors", "0"], "num_actors"),
        (["--gamma", "1.5"], "gamma"),
        (["--minibatch-size", "4096"], "minibatch_size"),
        (["--frames-per-batch", "1000"], "multiple of num_actors"),
        (["--num-actors", "3", "--nproc-per-node", "2"], "multiple of nproc_per_node"),
        (["--actors", "nohostport"], "host:port"),
        (["--actors", "a:1,a:1"], "listed twice"),
        (["--actors", "a:115688"], "1..65535"),  # gRPC dialled 115688 - 65536
        (["--seed", "-1"], "seed"),  # numpy's traceback, after the fleet started
        (["--hidden", "0"], "hidden"),
        # NaN weights after the first update, then a traceback
        (["--lr", "inf"], "lr must be finite and > 0, got inf"),
        (["--vf-coef", "inf"], "vf_coef must be finite and >= 0, got inf"),
        (["--ent-coef", "inf"], "ent_coef must be finite and >= 0, got inf"),
        # one frame's advantage has no std to be normalised by (NaN)
        (["--minibatch-size", "1"], "minibatch_size must be >= 2, got 1"),
        # ignored, yet recorded in summary.json as if it had applied
        (["--take-over"], "take_over applies to an --actors fleet"),
        # a clip range of 0 or below freezes or inverts the policy term; no clip is inf
        (["--clip-eps", "0"], "clip_eps must be > 0, got 0.0"),
        (["--max-grad-norm", "-1"], "max_grad_norm must be > 0, got -1.0"),
        (["--gae-lambda", "1.5"], "gae_lambda must be in [0, 1], got 1.5"),
        (["--seed", str(2**32)], "seed must be in [0, 2**32)"),
        # a minibatch bigger than the batch: the flag would silently be the batch's size
        (["--minibatch-size", "1025"], "minibatch_size (1025) exceeds frames_per_batch (1024)"),
        # async: one actor's batch of num_envs x T must still hold frames_per_batch
        (["--async", "--num-envs", "3", "--frames-per-batch", "1000"], "multiple of num_envs"),
        # the collector refused it once the fleet had started, as "the fleet at --actors: ..."
        (["--total-frames", str(2**63)], f"total_frames ({2**63}) in whole batches of"),
        # 2**63 - 1 frames are 2**63 in whole batches of 1024
        (["--total-frames", str(2**63 - 1)], "must be at most 2**63 - 1"),
    ],
)
def test_parse_args_raises_if_a_value_is_invalid(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_settings_target_return_defaults_to_475_for_cartpole_only():
    assert TrainSettings().effective_target_return == 475.0
    assert TrainSettings(env="Pendulum-v1").effective_target_return is None
    assert TrainSettings(target_return=math.inf).effective_target_return is None


def test_settings_with_actors_skip_the_local_batch_shape_check():
    settings = TrainSettings(actors=("h:1",), frames_per_batch=1000)
    assert settings.out_dir == "runs/CartPole-v1-seed1"


@pytest.mark.parametrize("flags", [["--num-envs", "4"], ["--num-actors=3"], ["--num-envs=2"]])
def test_fleet_size_flags_with_actors_are_refused(flags, capsys):
    """They size the fleet the job starts; with --actors they were ignored yet recorded."""
    with pytest.raises(SystemExit) as exited:
        parse_args(["--actors", "127.0.0.1:50051", *flags])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert flags[0].split("=")[0] in said
    assert "the actors' own --num-envs holds" in said
    assert parse_args(["--num-envs", "4"]).num_envs == 4  # without --actors: the job's fleet


def test_the_record_of_an_actors_run_leaves_the_fleet_size_out():
    record = TrainSettings(actors=("h:1",)).as_record()
    assert record["actors"] == ("h:1",)
    assert "num_envs" not in record
    assert "num_actors" not in record
    assert TrainSettings().as_record()["num_envs"] == 8


def _summary(out_dir: str) -> TrainSummary:
    return TrainSummary(
        env="CartPole-v1",
        sync=True,
        seed=1,
        frames=2048,
        batches=2,
        episodes=3,
        wall_time_s=2.0,
        fps=1024.0,
        final_return=21.5,
        target_return=475.0,
        reached_target=False,
        policy_version=3,
        out_dir=out_dir,
    )


def test_save_run_writes_weights_summary_and_curve(tmp_path):
    policy = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    out = tmp_path / "run"
    save_run(
        out,
        policy,
        _summary(str(out)),
        {"env": "CartPole-v1", "hidden": (8,)},
        ([10, 20, 30], [1.0, 2.0, 3.0]),
        window=2,
    )
    state, metadata = decode_weights((out / "policy.safetensors").read_bytes())
    assert set(state) == set(policy.state_dict())
    torch.testing.assert_close(state["0.weight"], policy[0].weight.detach())
    assert metadata["env"] == "CartPole-v1"
    record = json.loads((out / "summary.json").read_text())
    assert record["frames"] == 2048
    assert record["settings"]["hidden"] == [8]
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_learning_curve_handles_no_episodes(tmp_path):
    assert plot_learning_curve(tmp_path / "c.png", [], [], window=20, target=None, title="t")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_progress_without_tqdm_logs_lines_with_fields():
    stream = io.StringIO()
    progress = Progress(100, enabled=False, stream=stream)
    progress.update(50, {"return": "12.0", "lag": "1"})
    progress.close()
    line = stream.getvalue().strip()
    assert line.startswith("frames=50 fps=")
    assert line.endswith("return=12.0 lag=1")


def test_summary_to_text_names_the_outcome():
    text = _summary("runs/x").to_text()
    assert "2048 frames" in text
    assert "target 475 not reached" in text


def test_summary_to_text_of_a_rank_names_it_and_rank_0_as_the_writer():
    text = dataclasses.replace(_summary("runs/x"), ranks=2, rank=1).to_text()
    assert text.startswith("rank 1 of 2: CartPole-v1")
    assert text.endswith("outputs by rank 0")


def test_train_metrics_port_flag_reaches_the_collector_settings(
    capsys: pytest.CaptureFixture,
) -> None:
    assert parse_args(["--metrics-port", "9400"]).metrics_port == 9400
    assert parse_args([]).metrics_port is None
    for bad in ("70000", "-1"):
        with pytest.raises(SystemExit) as exited:
            parse_args(["--metrics-port", bad])
        assert exited.value.code == 2
        assert "metrics_port must be in 0..65535" in capsys.readouterr().err


def test_an_out_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys) -> None:
    """The results are written after training: an --out they cannot go to fails at start."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, why in [
        (blocker, "is a file"),
        (blocker / "run", "is a file"),
        ("/proc/x/y", "cannot"),
    ]:
        with pytest.raises(SystemExit) as exited:
            parse_args(["--out", str(out)])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"--out {out}: " in err
        assert why in err
    assert parse_args(["--out", str(tmp_path / "new" / "run")]).out_dir.endswith("new/run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing made at parse


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--target-return", "nan"], "expected a number, got nan"),
        (["--target-return", "abc"], "invalid float value: 'abc'"),
        (["--num-env", "4"], "unrecognized arguments: --num-env"),  # no abbreviations
    ],
)
def test_flags_refuse_nan_typos_and_abbreviations(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_optional_flags_take_none_as_the_help_shows_their_default() -> None:
    """The help writes an unset default as ``none``: that word, in any case, unsets the flag."""
    for word in ("none", "None", " NONE "):
        settings = parse_args(["--metrics-port", word, "--target-return", word])
        assert (settings.metrics_port, settings.target_return) == (None, None)


def test_progress_to_a_log_file_writes_lines_even_when_enabled():
    """The default (``enabled``) draws a bar only on a terminal: a log gets plain lines."""
    stream = io.StringIO()  # not a terminal
    progress = Progress(100, stream=stream)
    progress.update(50, {"return": "12.0"})
    progress.close()
    assert stream.getvalue().startswith("frames=50 fps=")
    assert "\r" not in stream.getvalue()


def test_save_weights_and_summary_makes_the_missing_parents_of_out(tmp_path):
    """``--out runs/a/b`` is accepted at parse when ``runs`` does not exist yet: the run's end
    must make the whole path, not lose the trained weights to a FileNotFoundError."""
    out = tmp_path / "runs" / "a" / "b"
    save_weights_and_summary(out, nn.Linear(2, 1), {"env": "CartPole-v1"}, {"frames": 64})
    assert json.loads((out / "summary.json").read_text()) == {"frames": 64}
    state, metadata = decode_weights((out / "policy.safetensors").read_bytes())
    assert set(state) == {"weight", "bias"}
    assert metadata["env"] == "CartPole-v1"


@contextlib.contextmanager
def _files_capped_at(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes of a file fail with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an error, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_save_weights_and_summary_that_fails_to_write_leaves_the_previous_outputs_whole(
    tmp_path,
):
    """A run that cannot finish writing (a full disk, a kill) into the ``--out`` of an earlier
    run used to truncate its policy.safetensors first: both runs' weights were lost."""
    save_weights_and_summary(tmp_path, nn.Linear(2, 1), {"run": "first"}, {"run": "first"})
    with _files_capped_at(256 * 1024), pytest.raises(OSError, match="too large") as failed:
        save_weights_and_summary(
            tmp_path, nn.Linear(512, 512), {"run": "second"}, {"run": "second"}
        )
    assert failed.value.errno == errno.EFBIG
    state, metadata = decode_weights((tmp_path / "policy.safetensors").read_bytes())
    assert metadata["run"] == "first"
    assert state["weight"].shape == (1, 2)
    assert json.loads((tmp_path / "summary.json").read_text()) == {"run": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.safetensors", "summary.json"]


def test_progress_counting_steps_logs_steps_not_frames():
    """GRPO counts updates (``unit="step"``): its lines say steps, with no frame rate."""
    stream = io.StringIO()
    Progress(10, enabled=False, stream=stream, unit="step").update(3, {"reward": "0.5"})
    assert stream.getvalue() == "steps=3 reward=0.5\n"
