"""What a user installing rlfleet from its wheel or source distribution gets.

The wheel and the sdist are built from a copy of the tracked sources (no build output in
the checkout), as ``pip wheel`` and ``python -m build`` build them, and their file lists
are read: the generated stubs, the license and the typing marker are there, the test suite
is not. The messages for a missing extra name the extra to install.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = os.environ | {"PYTHONPATH": str(ROOT)}
PACKAGES = ("actor_service", "learner_client", "common", "apps")


def _source_copy(dest: pathlib.Path) -> pathlib.Path:
    """The tracked files a build reads (the packages, metadata, contract), copied to ``dest``."""
    tracked = subprocess.run(
        ["git", "ls-files", *PACKAGES, "protos", "pyproject.toml", "README.md", "LICENSE",
         "MANIFEST.in"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in tracked:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    return dest


def _build(kind: str, tmp_path: pathlib.Path) -> pathlib.Path:
    source, out = _source_copy(tmp_path / "src"), tmp_path / "dist"
    out.mkdir()
    code = f"import sys, setuptools.build_meta as b\nprint(b.build_{kind}(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=source, capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_the_stubs_the_license_and_typing_markers_not_the_tests(
    tmp_path: pathlib.Path,
) -> None:
    wheel = zipfile.ZipFile(_build("wheel", tmp_path))
    names = set(wheel.namelist())
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names
        assert f"{package}/py.typed" in names  # PEP 561: a user's mypy reads our hints
    assert "common/rlfleet/v1/actor_service_pb2_grpc.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "bench/", "docs/")) for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in wheel.read(metadata).decode()


def test_the_sdist_holds_the_contract_and_license_not_a_slice_of_the_tests(
    tmp_path: pathlib.Path,
) -> None:
    with tarfile.open(_build("sdist", tmp_path)) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"LICENSE", "protos/common/rlfleet/v1/actor_service.proto", "pyproject.toml"} <= names
    assert "common/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)


def test_an_llm_actor_without_transformers_exits_2_naming_the_extra() -> None:
    hide = "import sys; sys.modules['transformers'] = sys.modules['tokenizers'] = None"
    out = subprocess.run(
        [sys.executable, "-c", f"{hide}\nfrom actor_service.__main__ import main\nmain()",
         "--kind", "llm", "--task", "arith", "--port", "0"],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "pip install 'rlfleet[llm]'" in out.stderr
    assert "ready" not in out.stdout


@pytest.mark.parametrize("hidden", ["transformers", "tokenizers"])
def test_llm_models_and_tokenizers_name_the_extra_when_a_package_is_missing(
    hidden: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from common.llm import build_policy, build_tokenizer

    monkeypatch.setitem(sys.modules, hidden, None)
    with pytest.raises(ModuleNotFoundError, match=rf"need {hidden}.*'rlfleet\[llm\]'"):
        build_tokenizer("arith")
    with pytest.raises(ModuleNotFoundError, match=r"'rlfleet\[llm\]'"):
        build_policy("rlfleet:tiny-qwen2")


def test_grpo_with_torchrls_loss_names_the_extra_without_torchrl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apps.grpo._torchrl_loss import import_torchrl

    monkeypatch.setitem(sys.modules, "torchrl", None)
    with pytest.raises(ImportError, match=r"pip install 'rlfleet\[torchrl\]'"):
        import_torchrl()
