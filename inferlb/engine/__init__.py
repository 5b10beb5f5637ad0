"""The request path: one request from the edge to the node and back, and its end.

``gateway`` drives a request's process instance and performs its external tasks; ``scope`` holds the
per-app :class:`Runtime` and per-request :class:`RequestScope`; ``upstream`` is the data-path HTTP
client; ``sse`` and ``streaming`` relay a node's stream; ``first_byte`` bounds the wait for a node's
first byte; ``outcomes`` holds the client-visible rules; ``request_end`` the end-of-request hook;
``tokens``, ``endpoints`` and ``request_ids`` the small parts they share.
"""
