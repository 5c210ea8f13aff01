"""Learner registry: name -> LearnerDef (the table itself is ``popjax.registry.LEARNERS``).

A new learner is one module with a ``DEFINITION`` and one line here (or ``register`` from a script).
"""

import dataclasses

from popjax import registry
from popjax.learners import a2c, dqn, fast_td3, memr, ppo, refer, rlx2, sac, shared_critic, spo, td3
from popjax.learners.base import Learner, LearnerDef
from popjax.registry import LEARNERS

# TD3 with its shared-critic population (that module builds on td3's losses, so it is attached here).
TD3 = dataclasses.replace(td3.DEFINITION, shared_critic=shared_critic.make_shared_critic_td3)

for _definition in (TD3, sac.DEFINITION, dqn.DEFINITION, *spo.DEFINITIONS, ppo.DEFINITION, a2c.DEFINITION,
                    *rlx2.DEFINITIONS, memr.DEFINITION, *refer.DEFINITIONS, fast_td3.DEFINITION):
    registry.add(LEARNERS, _definition, "learner")


def register(definition: LearnerDef) -> LearnerDef:
    """Adds a learner defined outside popjax (a script, a plugin); its name must be new.

    Register it again in the process that resumes or plots its runs."""
    return registry.add(LEARNERS, definition, "learner")


__all__ = ["LEARNERS", "Learner", "LearnerDef", "register"]
