"""TorchRL's own training scripts, run as TorchRL wrote them and with their collector on a fleet.

The scripts are not copied here: :mod:`bench.torchrl_scripts._run` reads them where TorchRL
ships them (README.md in this folder), :mod:`bench.torchrl_scripts._port` swaps their
``Collector(...)`` for a ``GrpcCollector`` over a ``LocalFleet`` of actors running the
script's factories (:mod:`bench.torchrl_scripts.fleets`), and
:mod:`bench.torchrl_scripts.compare` runs both at the same budget
(``python -m bench.torchrl_scripts``).
"""
