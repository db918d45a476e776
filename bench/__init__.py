"""Benchmarks of rlfleet against TorchRL's collectors, run side by side on one machine.

Each script (``python -m bench.<name> [--quick]``) measures rlfleet and its
anchors in the same run, prints a table and ends with one JSON line;
``python -m bench.run_all`` runs them all (``make bench``).
"""
