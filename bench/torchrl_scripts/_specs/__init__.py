"""The ported scripts: where each comes from, its fleet, its budgets and what it returns.

One module per family of TorchRL's scripts: :mod:`.control` (classic control and MuJoCo),
:mod:`.multiagent` (VMAS), :mod:`.atari` and :mod:`.tutorials`; :mod:`.spec` says what a
spec holds (:class:`ScriptSpec`) and builds the fleet arguments of a port.
"""

from __future__ import annotations

from bench.torchrl_scripts._specs import atari, control, multiagent, tutorials
from bench.torchrl_scripts._specs.spec import ScriptSpec

__all__ = ["SPECS", "ScriptSpec"]

#: Every ported script by name.
SPECS: dict[str, ScriptSpec] = {
    spec.name: spec for family in (control, multiagent, atari, tutorials) for spec in family.SPECS
}
