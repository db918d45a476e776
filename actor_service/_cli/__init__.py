"""The ``rlfleet-actor`` command line: flags and variables into settings, per-kind checks, serve."""
