"""Model versions: configuration, sticky weighted assignment, and the runtime weight table.

Layout: ``config`` (the ``versions:`` list of a model in the fleet file, checked at load),
``assign`` (pure sticky assignment: weighted rendezvous hashing), ``table`` (:class:`VersionTable`,
the runtime weights: the file's plus rollout overrides, replaced whole on change). This
package's ``__init__`` imports nothing, so ``settings`` can import ``config`` alone.
"""

__all__: list[str] = []
