"""What the actor service and the learner client share.

``common`` depends on nothing else of rlfleet. It holds the packet codec
(:mod:`common.packets`), the weight codec (:mod:`common.weights`), the error tree
(:mod:`common.errors`), shared settings (:mod:`common.config`) and the generated
gRPC stubs of the ``rlfleet.v1`` contract (:mod:`common.rlfleet.v1`).
"""

__version__ = "0.1.0"
