"""I/O-free routing core: filter → scorer → picker plugins over node snapshots."""

__all__: list[str] = []
