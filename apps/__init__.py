"""Applications built on rlfleet's libraries, using their public names only.

* :mod:`apps.ppo`: ``rlfleet-train``, the reference PPO learner (CartPole against a local fleet);
* :mod:`apps.grpo`: ``rlfleet-grpo``, the reference GRPO learner for LLM actors;
* :mod:`apps.status`: ``rlfleet status``, the operator's view of a fleet;
* :mod:`apps._job`: what the reference learners share (command line, seeding, reports).

Nothing in ``common``, ``actor_service`` or ``learner_client`` imports this package.
"""
