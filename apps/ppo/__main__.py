"""``python -m apps.ppo``: the same as the ``rlfleet-train`` script."""

from __future__ import annotations

import sys

from apps.ppo._cli import main

if __name__ == "__main__":
    sys.exit(main())
