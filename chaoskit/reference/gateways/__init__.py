"""The third-party gateways a reference deployment can put in front of its replicas (target.reference.gateway),
by name; `chaoskit` (the default) is chaoskit's own gateway (chaoskit.reference.gateway), not listed here."""

from __future__ import annotations

from chaoskit.errors import ChaoskitError
from chaoskit.model.gateways import CHAOSKIT, NAMES
from chaoskit.reference.gateways.base import GatewayKind
from chaoskit.reference.gateways.haproxy import HAProxy
from chaoskit.reference.gateways.litellm import LiteLLM
from chaoskit.reference.gateways.nginx import Nginx
from chaoskit.reference.gateways.rust_router import SglangRouter, VllmRouter

KINDS: tuple[type[GatewayKind], ...] = (VllmRouter, SglangRouter, LiteLLM, Nginx, HAProxy)
__all__ = ["CHAOSKIT", "KINDS", "NAMES", "kind"]


def kind(name: str) -> GatewayKind:
    for k in KINDS:
        if k.name == name:
            return k()
    raise ChaoskitError(f"gateway {name!r}: expected one of {', '.join(NAMES)}")
