"""The actor's allocator keeps freed push-sized blocks: the next push faults no page in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Frees and allocates 32 blocks of 3 MiB (a 96 MiB push's chunk messages) ten times.
_PUSHES = """
import json, resource, sys
from actor_service._serve._memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "tuned" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    chunks = [b"x" * (3 << 20) for _ in range(32)]
    del chunks
start = faults()
for _ in range(10):
    chunks = [b"x" * (3 << 20) for _ in range(32)]
    del chunks
print(json.dumps({"applied": applied, "faults": (faults() - start) // 10}))
"""


def pushes(mode: str, **env: str) -> dict[str, object]:
    environ = {**os.environ, "PYTHONPATH": os.getcwd(), **env}
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        if name not in env:
            environ.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", _PUSHES, mode], env=environ, capture_output=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_blocks_are_kept_for_the_next_push():
    plain, tuned = pushes("plain"), pushes("tuned")
    assert tuned["applied"] is True
    assert plain["faults"] > 20_000  # 96 MiB faulted in again, page by page
    assert tuned["faults"] < 1_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_an_operators_own_tunables_win():
    kept = pushes("tuned", MALLOC_TRIM_THRESHOLD_="0")
    assert kept["applied"] is False
    assert kept["faults"] > 20_000
