"""The actor's serving layer: the gRPC server, the servicer, its streams, sessions and metrics.

It builds the core of ``ActorConfig.kind`` through ``actor_service._kinds`` and then sees it
only through ``actor_service._core``'s protocol; no core imports the serving layer.
"""
