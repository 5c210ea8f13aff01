"""Driver registry: name -> DriverDef (how a population is trained; see ``popjax.drivers.base``); the table
itself is ``popjax.registry.DRIVERS``.

A new driver is one module with a ``DEFINITION`` and one line here (or ``register`` from a script).
"""

import dataclasses

from popjax import registry
from popjax.config import RunConfig
from popjax.drivers import cemrl, dvd, hts, independent, pbt
from popjax.drivers.base import DriverDef
from popjax.registry import DRIVERS

for _definition in (independent.DEFINITION, pbt.DEFINITION, cemrl.DEFINITION, dvd.DEFINITION, hts.DEFINITION):
    registry.add(DRIVERS, _definition, "driver")


def register(definition: DriverDef) -> DriverDef:
    """Adds a driver defined outside popjax (a script, a plugin); its name must be new.

    Register it again in the process that resumes or plots its runs.
    """
    taken = set(DRIVERS) | {f.name for f in dataclasses.fields(RunConfig)}
    if definition.name in taken:
        raise ValueError(f"driver name {definition.name!r} is taken (a driver or a RunConfig field)")
    return registry.add(DRIVERS, definition, "driver")


__all__ = ["DRIVERS", "DriverDef", "register"]
