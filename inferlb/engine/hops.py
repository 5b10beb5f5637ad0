"""Hop markers: no request loops through the gateway (a node whose URL leads back to it).

Every request the gateway sends to a node carries ``x-inferlb-hop``: the instance ids of the gateways
it has passed, this one last (``a-1, b-7``), and ``Via`` (RFC 9110 §7.6.3) saying the same. A request
that arrives is judged by :func:`check_hops`:

* it names this gateway's own id: it has come round a loop. Refused with 508 Loop Detected and
  **not** audited here: the request that started the loop is this gateway's own, and its audit row
  records the attempt that came back 508 (engine/outcomes.py answers the client 508 too), so a loop
  costs one audit row per client request, and no second pass through the process;
* it has passed ``INFERLB_MAX_HOPS`` gateways already (a loop through several gateways, each seeing
  it once): refused with 508 and audited like any refused input.

Pure: no I/O.
"""

from __future__ import annotations

import re

from inferlb.errors import ClientError

__all__ = ["HOP_HEADER", "LoopDetected", "check_hops", "hop_headers", "parse_hops"]

HOP_HEADER = "x-inferlb-hop"
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_MAX_LISTED = 64   # ids kept from a header, so a hostile one cannot make the next hop's header huge


class LoopDetected(ClientError):
    """508: the request came back to this gateway (``own``), or has passed too many gateways."""

    status = 508
    type = "server_error"

    def __init__(self, message: str, *, own: bool) -> None:
        super().__init__(message, param=HOP_HEADER, code="loop_detected")
        self.own = own


def parse_hops(value: str | None) -> tuple[str, ...]:
    """The instance ids of an ``x-inferlb-hop`` value (comma-separated; malformed entries dropped)."""
    if not value:
        return ()
    ids = [p.strip() for p in value.split(",")]
    return tuple(i for i in ids if _ID.match(i))[:_MAX_LISTED]


def check_hops(value: str | None, own_id: str, max_hops: int) -> tuple[str, ...]:
    """The hops a request arrived with; :class:`LoopDetected` when they name ``own_id`` or number
    ``max_hops`` or more (this gateway would be one more)."""
    hops = parse_hops(value)
    if own_id in hops:
        raise LoopDetected(f"Loop detected: this request already passed this gateway ({own_id}); a node's URL "
                           f"leads back to the gateway", own=True)
    if len(hops) >= max_hops:
        raise LoopDetected(f"Loop detected: this request has passed {len(hops)} gateways (at most {max_hops} "
                           f"are allowed: INFERLB_MAX_HOPS)", own=False)
    return hops


def hop_headers(hops: tuple[str, ...], own_id: str) -> dict[str, str]:
    """The headers a request to a node carries: the hops so far with this gateway appended."""
    path = [*hops, own_id]
    return {HOP_HEADER: ", ".join(path), "via": ", ".join(f"1.1 {h}" for h in path)}
