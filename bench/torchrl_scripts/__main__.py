"""``python -m bench.torchrl_scripts``: :func:`bench.torchrl_scripts.compare.main`."""

from bench.torchrl_scripts.compare import main

main()
