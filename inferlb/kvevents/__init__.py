"""Cache routing fed by the engines' KV events: vLLM's KV event messages (:mod:`.wire`), one
ZeroMQ subscriber a node (:mod:`.subscriber`) and the gateway's service around the event-fed
index (:mod:`.service`), which the routing step reads. See docs/kv-events.md."""

__all__: list[str] = []
