"""What the two reference learners share: command line, entry point, progress and outputs.

``rlfleet-train`` (:mod:`apps.ppo`) and ``rlfleet-grpo``
(:mod:`apps.grpo`) are each a settings dataclass, a loop and a summary;
what they do the same way lives here once: the settings dataclass as the command
line (:mod:`~apps._job.settings`), the entry point with its exit codes
and signal handling (:mod:`~apps._job.cli`), the progress bar and the
files a run leaves behind (:mod:`~apps._job.report`), and the data-parallel
ranks under torchrun (:mod:`~apps._job.ranks`).
"""
