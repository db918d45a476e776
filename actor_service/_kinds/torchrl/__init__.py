"""The TorchRL-env actor (``kind="torchrl"``): a TorchRL env pool and TensorDict policies.

The only actor code that imports torchrl, inside its functions (the ``rlfleet[torchrl]`` extra).
"""
