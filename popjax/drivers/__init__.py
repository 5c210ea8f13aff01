"""Drivers: how a population is trained (independent, pbt, ...) on top of the population functions."""

from __future__ import annotations

from pathlib import Path


def extra_plots(driver: str | None, run_dir) -> list[Path]:
    """Driver-specific plots of a run directory (e.g. PBT hyperparameter schedules)."""
    if driver == "pbt":
        from popjax.plots import pbt_plots

        return pbt_plots(run_dir)
    if driver in ("cemrl", "dvd"):
        from popjax.plots import shared_critic_plots

        return shared_critic_plots(run_dir, driver)
    return []
