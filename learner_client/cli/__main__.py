"""``python -m learner_client.cli``: the ``rlfleet`` command."""

from __future__ import annotations

import sys

from learner_client.cli import main

if __name__ == "__main__":
    sys.exit(main())
