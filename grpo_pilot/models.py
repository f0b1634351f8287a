"""Base class for every config and result: frozen, no unknown fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Frozen pydantic model with `extra="forbid"`; derived numbers go into new objects."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())
