"""``python -m apps.grpo``: the same as the ``rlfleet-grpo`` script."""

from __future__ import annotations

import sys

from apps.grpo._cli import main

if __name__ == "__main__":
    sys.exit(main())
