"""Weights & Biases: one W&B run per population (the optional extra ``pip install 'popjax[wandb]'``).

The run (named after the run directory, its config the run's config) gets, against ``env_steps``:

- every numeric metrics column of each member as ``member_<m>/<column>`` (its return, its learner metrics and its
  hparams: a PBT member's hparams over time), the loop's own columns (``updates``, ``wall_s``) once, and the
  population's ``population/mean_eval_return`` and ``population/best_eval_return``;
- at the end, the summary (``run.summary``), each record list of the summary as a Table of the same name (PBT's
  ``lineage``: one row per exploit with its env steps, member, parent, fitnesses, old and new hparams) and each
  table of the run directory as a Table named after its file (``lineage.csv``: every member at every round).

W&B's own settings come from its environment variables (``WANDB_PROJECT``, default ``popjax``; ``WANDB_ENTITY``,
``WANDB_MODE=offline``, ``WANDB_RUN_GROUP``, ...); ``check`` refuses an unknown mode, or an online run without
credentials, before anything is written. Its files go to ``<run_dir>/wandb/``; the run's id is kept there, so
``popjax resume`` continues the same W&B run, and so are the env steps last logged: a resume logs the rows after
them only (the rows metrics.csv logs again after the checkpoint are in W&B already). A run that ends by an error
is marked failed in W&B (exit code 1), a completed one finished.
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from popjax.config import ConfigError
from popjax.loggers.base import Logger, LoggerDef

FOLDER = "wandb"
RUN_ID = "popjax-run-id"  # the W&B run's id, kept so that a resume logs into the same run
LOGGED = "popjax-logged-steps"  # the env steps of the last rows logged: a resume logs only later ones
NO_LOGIN_MODES = ("offline", "dryrun", "disabled")
LOOP_COLUMNS = ("updates", "wall_s")  # the loop's own columns: the same in every member's row


class WandbLogger(Logger):
    def __init__(self, path: Path, config: Mapping[str, Any]):
        import wandb

        folder = path / FOLDER
        folder.mkdir(exist_ok=True)
        id_file = folder / RUN_ID
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "popjax", name=path.name, id=run_id,
                                  resume="allow", dir=path, config=dict(config),
                                  tags=[str(config.get(k)) for k in ("learner", "driver", "env")],
                                  reinit="create_new",  # its own run, beside any the caller has open
                                  settings=wandb.Settings(console="off"))  # popjax's progress stays as it is
        except (wandb.errors.Error, OSError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"logger: wandb could not start a run ({first}); log in with `wandb login`, or set "
                              "WANDB_MODE=offline; the run directory holds its config: `popjax resume "
                              f"{path}` starts it") from None
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")
        self.logged_file = folder / LOGGED
        self.logged = int(self.logged_file.read_text()) if self.logged_file.is_file() else -1
        self.completed = False

    def rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for env_steps, group in itertools.groupby(rows, key=lambda row: row["env_steps"]):
            if env_steps <= self.logged:  # logged before the run was resumed
                continue
            data: dict[str, Any] = {"env_steps": env_steps}
            returns = []
            for row in group:
                member = f"member_{int(row['member'])}/" if "member" in row else ""
                for name, value in row.items():
                    if name not in ("env_steps", "member") and _number(value):
                        data[name if name in LOOP_COLUMNS else member + name] = value
                if _number(row.get("eval_return")) and math.isfinite(row["eval_return"]):
                    returns.append(row["eval_return"])
            if returns:
                data["population/mean_eval_return"] = sum(returns) / len(returns)
                data["population/best_eval_return"] = max(returns)
            self.run.log(data)
            self.logged = env_steps
            self.logged_file.write_text(f"{env_steps}\n")

    def finish(self, summary: Mapping[str, Any], tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        import wandb

        records = {key: value for key, value in summary.items() if _is_records(value)}
        self.run.summary.update({key: value for key, value in summary.items() if key not in records})
        logged = {**records, **tables}
        self.run.log({name: _table(wandb, rows) for name, rows in logged.items() if rows})
        self.completed = True

    def close(self) -> None:
        self.run.finish(exit_code=0 if self.completed else 1)  # closed without finish: the run failed


def check(config: Mapping[str, Any]) -> None:
    """A one-line ConfigError for W&B settings that cannot start a run: an unknown ``WANDB_MODE``, or an online run
    without credentials (``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE`` or a netrc entry, what ``wandb login``
    writes). Reads only; run before anything is written."""
    del config
    import typing

    import wandb

    mode = os.environ.get("WANDB_MODE") or "online"
    modes = typing.get_args(wandb.Settings.model_fields["mode"].annotation)
    if modes and mode not in modes:
        raise ConfigError(f"logger: wandb: WANDB_MODE={mode!r} is not a W&B mode (allowed: {', '.join(modes)})")
    if mode in NO_LOGIN_MODES or os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    try:
        from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth
    except ImportError:  # another W&B version: its own error, when the run starts
        return
    try:
        key = read_netrc_auth(host=os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    except Exception as err:  # noqa: BLE001 (W&B's error for a malformed entry)
        raise ConfigError(f"logger: wandb: its credentials cannot be read ({str(err).splitlines()[0]}); log in "
                          "with `wandb login`, or set WANDB_MODE=offline (allowed: online when logged in, "
                          f"{', '.join(NO_LOGIN_MODES)})") from None
    if not key:
        raise ConfigError("logger: wandb is not logged in; log in with `wandb login` (or set WANDB_API_KEY), or "
                          f"set WANDB_MODE=offline (allowed: online when logged in, {', '.join(NO_LOGIN_MODES)})")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_records(value: Any) -> bool:
    """A list of mappings (PBT's exploits in the summary)."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _flat(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"new_hparams": {"lr": x}}`` -> ``{"new_hparams.lr": x}``."""
    out = {}
    for key, value in row.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _table(wandb, rows: Sequence[Mapping[str, Any]]):
    flat = [_flat(row) for row in rows]
    columns = list(dict.fromkeys(key for row in flat for key in row))
    return wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in flat])


DEFINITION = LoggerDef(name="wandb", make=WandbLogger, package="wandb", install="pip install 'popjax[wandb]'",
                       # the links first: once their targets are gone a glob no longer finds them
                       outputs={FOLDER: ("latest-run", "debug.log", "debug-internal.log", "offline-run-*", "run-*",
                                         RUN_ID, LOGGED)},
                       check=check)
