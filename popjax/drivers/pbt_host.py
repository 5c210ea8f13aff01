"""PBT's host side: the lineage, ``lineage.csv`` and PB2's proposals (what cannot be traced)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from popjax.distributed import fetch
from popjax.drivers.base import DriverHost
from popjax.drivers.pbt_options import PBTConfig
from popjax.population import constraints
from popjax.population.hparams import hparams_table
from popjax.population.pb2 import PB2


class PBTHost(DriverHost):
    """Writes the lineage (one entry per replaced member and round) around the host of the driver PBT
    transforms (``inner``; by default the plain one), which keeps its own rows, records and checkpoints. With
    ``explore: pb2`` it also keeps PB2's data and proposes the replaced members' hparams (seeded by the run's
    ``seed`` and the round's env steps, so a resumed run proposes the same)."""

    def __init__(self, inner: DriverHost | None = None, config: PBTConfig | None = None, seed: int = 0):
        self.inner = inner or DriverHost(lambda state: state.hparams)
        super().__init__(self.inner.hparams)
        self.lineage: list[dict[str, Any]] = []
        self.rounds: list[dict[str, Any]] = []  # lineage.csv: every member at every round (round 0: initial)
        self.pb2 = PB2(config.search_space) if config is not None and config.explore == "pb2" else None
        self.config, self.seed = config, seed

    def propose(self, state, info):
        if self.pb2 is None or not info["ready"]:
            return None
        t, fitness, parent = int(info["env_steps"]), np.asarray(info["fitness"]), np.asarray(info["parent"])
        old = hparams_table(info["old_hparams"])
        for m in range(len(fitness)):
            self.pb2.log(m, t, fitness[m], self.pb2.unit({name: old[name][m] for name, _ in self.pb2.space}))
        losers = np.flatnonzero(info["explored"]).tolist()
        contexts = [self.pb2.context(int(parent[m]), t) for m in losers]
        picks = self.pb2.propose(contexts, np.random.default_rng([self.seed, t]))
        hparams = fetch(self.hparams(state))
        columns = {name: np.array(getattr(hparams, name)) for name, _ in self.pb2.space}
        rng = np.random.default_rng([self.seed, t, 1])
        for m, pick in zip(losers, picks, strict=True):
            values = self._keep_constraints(self.pb2.values(pick), {n: old[n][parent[m]] for n in old}, rng)
            for name, value in values.items():
                columns[name][m] = value
            # the member's next improvement is measured from its parent's weights and fitness
            self.pb2.log(m, t, fitness[parent[m]], self.pb2.unit(values))
        return hparams.replace(**columns)

    def rows(self, state, metrics, returns):
        return self.inner.rows(state, metrics, returns)

    def record(self, state, env_steps, returns, info) -> None:
        self.inner.record(state, env_steps, returns, info)
        if not self.rounds:  # round 0: every member's initial hparams
            self._log_round(0, info["old_hparams"], range(len(returns)), [None] * len(returns))
        if not info["ready"]:
            return
        old, new = hparams_table(info["old_hparams"]), hparams_table(state.hparams)
        fitness, parent = info["fitness"], info["parent"]
        self._log_round(env_steps, state.hparams, parent.tolist(), fitness.tolist())
        for m in np.flatnonzero(info["loser"]).tolist():
            p = int(parent[m])
            self.lineage.append({
                "env_steps": int(env_steps), "member": m, "parent": p,
                "fitness": _json_float(fitness[m]), "parent_fitness": _json_float(fitness[p]),
                "old_hparams": {name: values[m] for name, values in old.items()},
                "new_hparams": {name: values[m] for name, values in new.items()},
            })

    def _keep_constraints(self, values: dict[str, float], parent: dict[str, float], rng) -> dict[str, float]:
        """A PB2 pick that breaks a constraint: redrawn from the prior, else the parent's values (as in the
        compiled explore)."""
        cs = self.config.constraints
        if not cs or constraints.satisfied(cs, values):
            return values
        names, space = sorted({n for c in cs for n in c.names}), self.config.space
        for _ in range(constraints.TRIES):
            draw = {**values, **{n: float(space[n].sample_numpy(rng, 1)[0]) for n in names}}
            if constraints.satisfied(cs, draw):
                return draw
        return {**values, **{n: parent[n] for n in names}}

    def _log_round(self, env_steps, hparams, parent, fitness) -> None:
        """One ``lineage.csv`` row per member: who it copied (itself when not replaced), its fitness at the round
        and the hparams it trains with from there."""
        r = self.rounds[-1]["round"] + 1 if self.rounds else 0
        table = hparams_table(hparams)
        for m, (p, f) in enumerate(zip(parent, fitness, strict=True)):
            self.rounds.append({"round": r, "member": m, "parent": int(p),
                                "fitness": None if f is None else _json_float(f), "env_steps": int(env_steps),
                                **{n: v[m] for n, v in table.items()}})

    def tables(self, state) -> dict[str, list[dict[str, Any]]]:
        return {**self.inner.tables(state), "lineage.csv": [dict(row) for row in self.rounds]}

    def summary(self, state) -> dict[str, Any]:
        record = fetch(state.pbt)
        return {**self.inner.summary(state), "lineage": [dict(e) for e in self.lineage], "pbt": {
            "rounds": int(record.rounds), "last_ready_env_steps": int(record.last_ready),
            "fitness_window": [[_json_float(v) for v in row] for row in np.asarray(record.window).tolist()],
            "window_count": np.asarray(record.count).tolist()}}

    def state_dict(self) -> dict[str, Any]:
        pb2 = {} if self.pb2 is None else {"pb2_rows": [list(r) for r in self.pb2.rows]}
        return {**self.inner.state_dict(), "lineage": [dict(e) for e in self.lineage],
                "rounds": [dict(r) for r in self.rounds], **pb2}

    def load_state_dict(self, data) -> None:
        self.inner.load_state_dict(data)
        self.lineage = [dict(e) for e in data.get("lineage", [])]
        self.rounds = [dict(r) for r in data.get("rounds", [])]
        if self.pb2 is not None:
            self.pb2.rows = [list(r) for r in data.get("pb2_rows", [])]


def _json_float(x: float) -> float | None:
    """NaN/inf -> None, so the lineage is strict JSON."""
    x = float(x)
    return x if math.isfinite(x) else None
