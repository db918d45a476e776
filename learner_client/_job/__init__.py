"""What the two reference learners share: command line, entry point, progress and outputs.

``rlfleet-train`` (:mod:`learner_client.train`) and ``rlfleet-grpo``
(:mod:`learner_client.grpo`) are each a settings dataclass, a loop and a summary;
what they do the same way lives here once: the settings dataclass as the command
line (:mod:`~learner_client._job.settings`), the entry point with its exit codes
and signal handling (:mod:`~learner_client._job.cli`), and the progress bar and the
files a run leaves behind (:mod:`~learner_client._job.report`).
"""
