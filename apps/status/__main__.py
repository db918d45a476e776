"""``python -m apps.status``: the ``rlfleet`` command."""

from __future__ import annotations

import sys

from apps.status import main

if __name__ == "__main__":
    sys.exit(main())
