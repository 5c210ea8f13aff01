"""Driver registry: name -> DriverDef (how a population is trained; see ``popjax.drivers.base``).

A new driver is one module with a ``DEFINITION`` and one line here.
"""

from popjax.drivers import cemrl, dvd, hts, independent, pbt
from popjax.drivers.base import DriverDef

DRIVERS: dict[str, DriverDef] = {d.name: d for d in (
    independent.DEFINITION,
    pbt.DEFINITION,
    cemrl.DEFINITION,
    dvd.DEFINITION,
    hts.DEFINITION,
)}



def register(definition: DriverDef) -> DriverDef:
    """Adds a driver defined outside popjax (a script, a plugin); its name must be new.

    Register it again in the process that resumes or plots its runs.
    """
    import dataclasses

    from popjax.config import RunConfig

    taken = set(DRIVERS) | {f.name for f in dataclasses.fields(RunConfig)}
    if definition.name in taken:
        raise ValueError(f"driver name {definition.name!r} is taken (a driver or a RunConfig field)")
    DRIVERS[definition.name] = definition
    return definition


__all__ = ["DRIVERS", "DriverDef", "register"]
