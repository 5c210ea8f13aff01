"""The independent driver: members never interact (seeds and hyperparameter sweeps)."""

from __future__ import annotations

from typing import Any

import jax

from popjax.drivers.population import PopState
from popjax.types import Key


class IndependentDriver:
    """Hook object called by the training loop; independent members need no intervention."""

    name = "independent"

    def after_eval(self, key: Key, state: PopState, returns: jax.Array, env_steps: int) -> PopState:
        """Called after every evaluation with the members' mean returns ``[pop]``."""
        del key, returns, env_steps
        return state

    def state_dict(self) -> dict[str, Any]:
        """Host-side driver state to checkpoint and to put in summary.json."""
        return {}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        del data
