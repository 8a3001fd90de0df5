"""What pre-flight read and checked, handed to whatever plays: the life, the plan's projection, a re-audit.

Its own module so that pre-flight (which plays the projection for an endpoint's window check) and the
player (`playing.py`) both take it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..bindings import Bindings
from ..config import RunConfig
from ..protocol.player import Player
from ..protocol.prompts import PromptPack
from ..protocol.spec import Dataset
from .endpoints import Endpoint


@dataclass(frozen=True)
class Ready:
    """What the work needs, read and checked: the config as planned, and what it names."""

    cfg: RunConfig  # with planned memory shares and devices filled in
    pack: PromptPack
    dataset: Dataset | None = None
    narrator_cls: type | None = None
    narrator_kwargs: dict[str, Any] = field(default_factory=dict)  # the method's options, checked
    player: Player | None = None
    # The roles on an OpenAI-compatible endpoint, health-checked: settings and the server's report.
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    # What each role runs on, resolved once from the config as planned (`bindings`) and as given
    # (`given`: a sweep keys its shared engines by it, and places them per group of points).
    bindings: Bindings = field(default=None)  # type: ignore[assignment]
    given: Bindings = field(default=None)  # type: ignore[assignment]

    def make_narrator(self, roles: Any) -> Any:
        assert self.narrator_cls is not None
        return self.narrator_cls(pack=self.pack, roles=roles, **self.narrator_kwargs)
