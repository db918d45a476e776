"""A Hydra/OmegaConf config as factory arguments: plain JSON on the way, a DictConfig again."""

from __future__ import annotations

import json
import sys

import pytest

from common.plain_config import OMEGACONF_KEY, from_plain, to_plain

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
