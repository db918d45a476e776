"""The gymnasium env actor (``kind="env"``): an env pool of gymnasium envs and its models."""
