"""Driver registry: name -> DriverDef (how a population is trained; see ``popjax.drivers.base``).

A new driver is one module with a ``DEFINITION`` and one line here.
"""

from popjax.drivers import cemrl, dvd, independent, pbt
from popjax.drivers.base import DriverDef

DRIVERS: dict[str, DriverDef] = {d.name: d for d in (
    independent.DEFINITION,
    pbt.DEFINITION,
    cemrl.DEFINITION,
    dvd.DEFINITION,
)}

__all__ = ["DRIVERS", "DriverDef"]
