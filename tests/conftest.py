"""Shared pytest configuration."""

import importlib.util
import ipaddress
import os
import signal
import socket

import pytest
import torch

from common.shm import sweep_segments

# Nothing downloads at test time: Hugging Face libraries stay offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Ctrl-C interrupts, as in a terminal, also when the suite was started in the background of a
# script (such a shell starts it with SIGINT ignored, and every process it starts inherits
# that): the tests that send SIGINT to a command or to themselves expect it to interrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip where torch sees no CUDA device (CI, CPU machines), and
    tests marked ``vllm`` where vLLM is not installed (its own venv: ``make test-vllm``), and
    tests marked ``ray`` where Ray is not installed (``make test-ray``)."""
    skips = {}
    if not torch.cuda.is_available():
        skips["cuda"] = "needs a CUDA device (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("vllm") is None:
        skips["vllm"] = "needs vLLM (make test-vllm runs these in .venv-vllm)"
    if importlib.util.find_spec("ray") is None:
        skips["ray"] = "needs Ray (make test-ray runs these in .venv-ray)"
    for item in items:
        for marker, reason in skips.items():
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the shared-memory segments of the actors the tests killed (SIGKILL leaves
    them), as the next actor or learner on the host would."""
    sweep_segments()


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse every connection from this process to a non-loopback address."""
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: object) -> object:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = str(address[0])  # type: ignore[index]
            if not ipaddress.ip_address(host.split("%")[0]).is_loopback:
                raise ConnectionRefusedError(f"test network guard: no connection to {host}")
        return real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
