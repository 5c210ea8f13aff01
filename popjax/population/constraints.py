"""Relations between explored hparams (``noise_clip >= target_noise``, ``policy_delay divides 4``), as data.

A constraint is ``<operand> <op> <operand>`` with op one of ``<=, >=, <, >, divides``; an operand is an explored
hparam, a number, or an integer run option (``rollout_len``, resolved when the run is checked). ``holds`` works
on numpy and jnp arrays alike (operators only), so the host (checks, PB2's proposals) and the compiled explore
evaluate the same relation.

How a relation is kept: explored values that break one are redrawn from the prior (jointly, ``TRIES`` times, in
the compiled explore) and, if every redraw breaks it too, replaced by values known to satisfy it (a replaced
member's parent's, which it trained with; at the start, a feasible point drawn on the host). So no member ever
trains with values that break a relation. A relation that none of ``DRAWS`` prior draws satisfies is refused
before anything runs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from popjax.population import tree
from popjax.population.hparams import Range
from popjax.schema import Invalid, parse_number
from popjax.types import Key

OPS = ("<=", ">=", "<", ">", "divides")
TRIES = 16  # joint redraws in the compiled explore before falling back to known-good values
DRAWS = 10_000  # host draws that look for a feasible point
_PATTERN = re.compile(r"^\s*(\S+)\s+(<=|>=|<|>|divides)\s+(\S+)\s*$")


@dataclasses.dataclass(frozen=True)
class Constraint:
    """``left op right``; an operand is an hparam name (str) or a number (float)."""

    left: str | float
    op: str
    right: str | float

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(x for x in (self.left, self.right) if isinstance(x, str))

    def holds(self, values: Mapping[str, object]):
        """Bool array: the relation for each member (``values``: name -> array, numpy or jnp)."""
        a, b = (values[x] if isinstance(x, str) else x for x in (self.left, self.right))
        if self.op == "divides":  # a divides b: an integer multiple (a != 0)
            return (a != 0) & ((b % (a + (a == 0))) == 0)
        return {"<=": a <= b, ">=": a >= b, "<": a < b, ">": a > b}[self.op]

    def __str__(self) -> str:
        show = lambda x: x if isinstance(x, str) else f"{x:g}"
        return f"{show(self.left)} {self.op} {show(self.right)}"


def parse(text: str, explored: Sequence[str], numbers: Mapping[str, float]) -> Constraint:
    """A constraint from its text; ``numbers``: run options usable as operands. Raises ``Invalid``."""
    match = _PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise Invalid(f"expected '<hparam> <op> <hparam or number>' with op one of {', '.join(OPS)}, got {text!r}")
    operands = []
    for token in (match.group(1), match.group(3)):
        if token in explored:
            operands.append(token)
        elif token in numbers:
            operands.append(float(numbers[token]))
        elif (number := parse_number(token)) is not None:
            operands.append(float(number))
        else:
            raise Invalid(f"{token!r} is neither an explored hparam nor a number (allowed: {', '.join(explored)}, "
                          f"numbers, {', '.join(numbers)})")
    constraint = Constraint(operands[0], match.group(2), operands[1])
    if not constraint.names:
        raise Invalid(f"{text!r} relates no explored hparam (allowed: {', '.join(explored)})")
    return constraint


def satisfied(constraints: Sequence[Constraint], values: Mapping[str, object]):
    """Bool array: every constraint holds (True where there are none)."""
    ok = True
    for c in constraints:
        ok = ok & c.holds(values)
    return ok


def feasible_point(space: Mapping[str, Range], constraints: Sequence[Constraint], seed: int = 0
                   ) -> dict[str, float]:
    """Values of the constrained hparams that satisfy every constraint, found among ``DRAWS`` prior draws;
    ``Invalid`` naming the constraint (index and text) that no draw satisfies."""
    rng = np.random.default_rng(seed)
    names = sorted({n for c in constraints for n in c.names})
    draws = {n: space[n].sample_numpy(rng, DRAWS) for n in names}
    for i, c in enumerate(constraints):
        if not np.any(c.holds(draws)):
            raise Invalid(f"no value of the search space satisfies {c} (none of {DRAWS} prior draws)", at=(i,))
    ok = np.flatnonzero(satisfied(constraints, draws))
    if not len(ok):
        raise Invalid(f"no values of the search space satisfy all of them together (none of {DRAWS} prior draws)")
    return {n: float(draws[n][ok[0]]) for n in names}


def enforce(key: Key, hparams, fallback, space: Mapping[str, Range], constraints: Sequence[Constraint],
            redraw=None):
    """``hparams`` ([pop] HParams) with every member that breaks a constraint redrawn from the prior (``redraw``
    members only, default all) and, after ``TRIES`` failed redraws, given ``fallback``'s values (known good)."""
    if not constraints:
        return hparams
    names = sorted({n for c in constraints for n in c.names})
    pop = tree.size(hparams)
    redraw = jnp.ones(pop, bool) if redraw is None else redraw
    def redraw_broken(t, values):
        bad = redraw & ~satisfied(constraints, values)
        key_t = jax.random.fold_in(key, t)
        return {n: jnp.where(bad, space[n].sample(jax.random.fold_in(key_t, i), (pop,)).astype(v.dtype), v)
                for i, (n, v) in enumerate(values.items())}

    values = jax.lax.fori_loop(0, TRIES, redraw_broken, {n: getattr(hparams, n) for n in names})
    ok = satisfied(constraints, values)
    return hparams.replace(**{n: jnp.where(ok, v, getattr(fallback, n)) for n, v in values.items()})
