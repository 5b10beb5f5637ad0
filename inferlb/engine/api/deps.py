"""Annotated dependencies: routers read app-wide objects from ``request.app.state`` (set by
``create_app``'s lifespan), never from module globals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from ..gateway import Gateway

__all__ = ["GatewayDep", "get_gateway", "get_state"]


def get_gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def get_state(request: Request) -> Any:
    return request.app.state


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
