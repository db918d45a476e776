"""What every collection core shares, whatever its kind: the protocol, the base and the rules.

The serving layer (``actor_service._serve``) sees a core only through
:class:`CollectionCore` and :class:`CoreModels`, and gives it a :class:`BatchRecorder` to
count into; each kind of actor (``actor_service._kinds``) builds its core on
``CoreBase`` and its models on the shared model book, swap and weight rules here. Nothing
here imports a kind or the serving layer.

The package imports nothing itself (no torch): the settings a config reads
(``_settings``) load without the cores.
"""
