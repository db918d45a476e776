"""``python -m learner_client.train``: the same as the ``rlfleet-train`` script."""

from __future__ import annotations

import sys

from learner_client.train._cli import main

if __name__ == "__main__":
    sys.exit(main())
