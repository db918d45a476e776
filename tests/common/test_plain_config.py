"""A Hydra/OmegaConf config as factory arguments: plain JSON on the way, a DictConfig again."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import pathlib
import re
import sys

import pytest
import torch

from common.plain_config import MAX_DEPTH, OMEGACONF_KEY, from_plain, to_plain

omegaconf = pytest.importorskip("omegaconf")
DictConfig, ListConfig, OmegaConf = omegaconf.DictConfig, omegaconf.ListConfig, omegaconf.OmegaConf

CFG = {"env": {"name": "Pendulum-v1", "frames": 4}, "seed": 3, "tag": "${env.name}-run"}


def test_a_config_travels_as_json_and_comes_back_a_dictconfig() -> None:
    cfg = OmegaConf.create(CFG)
    kwargs = {"cfg": cfg, "layers": OmegaConf.create([64, 64]), "n": 2}
    text = json.dumps(to_plain(kwargs))  # JSON: no pickle on the way
    plain = json.loads(text)
    assert plain["cfg"] == {OMEGACONF_KEY: {**CFG, "tag": "Pendulum-v1-run"}}  # resolved
    back = from_plain(plain)
    assert isinstance(back["cfg"], DictConfig)
    assert back["cfg"].env.name == "Pendulum-v1"
    assert back["cfg"].tag == "Pendulum-v1-run"
    assert isinstance(back["layers"], ListConfig)
    assert list(back["layers"]) == [64, 64]
    assert back["n"] == 2


def test_a_whole_dictconfig_as_kwargs_gives_its_keys_nested_configs_rebuilt() -> None:
    cfg = OmegaConf.create(CFG)
    back = from_plain(json.loads(json.dumps(to_plain(cfg))))
    assert sorted(back) == ["env", "seed", "tag"]
    assert isinstance(back["env"], DictConfig)
    assert back["seed"] == 3


def test_plain_kwargs_pass_unchanged() -> None:
    kwargs = {"a": [1, {"b": 2}], "c": "x"}
    assert to_plain(kwargs) == kwargs
    assert from_plain(kwargs) == kwargs


def test_without_omegaconf_on_the_actor_a_config_stays_plain_data(monkeypatch) -> None:
    plain = json.loads(json.dumps(to_plain({"cfg": OmegaConf.create(CFG)})))
    monkeypatch.setitem(sys.modules, "omegaconf", None)  # not importable here
    back = from_plain(plain)
    assert back["cfg"] == {**CFG, "tag": "Pendulum-v1-run"}
    assert type(back["cfg"]) is dict


def test_configs_nested_in_lists_tuples_and_dicts_travel_and_come_back() -> None:
    cfg = OmegaConf.create(CFG)
    kwargs = {"stages": [cfg, 1], "pair": (cfg, "x"), "inner": {"cfg": cfg, "k": 2}}
    plain = json.loads(json.dumps(to_plain(kwargs)))
    resolved = {**CFG, "tag": "Pendulum-v1-run"}
    assert plain["stages"] == [{OMEGACONF_KEY: resolved}, 1]
    assert plain["pair"] == [{OMEGACONF_KEY: resolved}, "x"]
    assert plain["inner"] == {"cfg": {OMEGACONF_KEY: resolved}, "k": 2}
    back = from_plain(plain)
    assert isinstance(back["stages"][0], DictConfig)
    assert back["stages"][1] == 1
    assert isinstance(back["pair"][0], DictConfig)
    assert back["pair"][1] == "x"
    assert isinstance(back["inner"]["cfg"], DictConfig)
    assert back["inner"]["k"] == 2
    assert back["inner"]["cfg"].env.frames == 4


def test_a_mapping_with_the_marker_key_and_others_is_plain_data_not_a_config() -> None:
    kwargs = {"d": {OMEGACONF_KEY: {"a": 1}, "other": 2}}
    assert from_plain(kwargs) == kwargs
    assert type(from_plain(kwargs)["d"]) is dict


def test_a_user_class_named_dictconfig_outside_omegaconf_stays_a_mapping() -> None:
    mine = type("DictConfig", (dict,), {})(a=1)  # a user's own class of omegaconf's name
    assert to_plain({"cfg": mine}) == {"cfg": {"a": 1}}


class Mode(enum.Enum):
    TRAIN = 1


@dataclasses.dataclass
class Run:
    mode: Mode = Mode.TRAIN
    out: pathlib.Path = pathlib.Path("/runs")


@pytest.mark.parametrize(
    ("kwargs", "where", "kind"),
    [
        ({"cfg": OmegaConf.structured(Run)}, "env_kwargs['cfg']['mode']", "Mode"),
        ({"mode": Mode.TRAIN}, "env_kwargs['mode']", "Mode"),
        ({"out": pathlib.Path("/runs")}, "env_kwargs['out']", "PosixPath"),
        ({"cfg": OmegaConf.create({"key": b"k"})}, "env_kwargs['cfg']['key']", "bytes"),
        ({"net": {"device": torch.device("cpu")}}, "env_kwargs['net']['device']", "device"),
        ({"dtypes": [torch.float32]}, "env_kwargs['dtypes'][0]", "dtype"),
        ({"loc": torch.zeros(3)}, "env_kwargs['loc']", "Tensor"),
        ({"make": print}, "env_kwargs['make']", "builtin_function_or_method"),
    ],
)
def test_to_plain_raises_if_a_value_json_does_not_carry_naming_where(kwargs, where, kind) -> None:
    # json.dumps said only "Object of type Mode is not JSON serializable".
    with pytest.raises(TypeError, match=re.escape(f"{where} is a {kind} (")) as raised:
        to_plain(kwargs, "env_kwargs")
    assert "rebuild it in the factory" in str(raised.value)


def test_a_str_or_int_enum_arrives_as_its_value_as_json_gives_it() -> None:
    class Level(enum.StrEnum):
        HIGH = "high"

    class Size(enum.IntEnum):
        BIG = 64

    plain = json.loads(json.dumps(to_plain({"level": Level.HIGH, "size": [Size.BIG]})))
    assert plain == {"level": "high", "size": [64]}


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"sizes": {1: 64}}, "env_kwargs['sizes'] has the key 1"),
        ({"cfg": OmegaConf.create({2: "b"})}, "env_kwargs['cfg'] has the key 2"),
        ({3: "c"}, "env_kwargs has the key 3"),
        ({"by_pair": {(0, 1): "x"}}, "env_kwargs['by_pair'] has the key (0, 1)"),
    ],
)
def test_to_plain_raises_if_a_key_is_not_a_string(kwargs, where) -> None:
    # JSON made the int key 1 the string "1": the factory's d[1] failed on the actor only.
    with pytest.raises(TypeError, match=re.escape(where)):
        to_plain(kwargs, "env_kwargs")


def test_to_plain_raises_if_arguments_nest_too_deeply_not_a_recursion_error() -> None:
    deep: dict = {}
    inner = deep
    for _ in range(10_000):
        inner["a"] = inner = {}
    with pytest.raises(ValueError, match=f"nested more than {MAX_DEPTH} levels deep"):
        to_plain({"deep": deep})
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="nested more than"):
        to_plain({"loop": loop})
    to_plain({"ok": _nested(MAX_DEPTH - 1)})


def _nested(depth: int) -> object:
    return [] if depth == 0 else [_nested(depth - 1)]


def test_nan_inf_and_ints_past_64_bits_arrive_as_they_are() -> None:
    cfg = OmegaConf.create({"lr": float("nan"), "clip": float("inf"), "big": 2**70})
    back = from_plain(json.loads(json.dumps(to_plain({"cfg": cfg, "tuple": (1, 2)}))))
    assert math.isnan(back["cfg"].lr)
    assert (back["cfg"].clip, back["cfg"].big, back["tuple"]) == (float("inf"), 2**70, [1, 2])
