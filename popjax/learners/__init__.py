"""Learner registry: name -> LearnerDef."""

from popjax.learners import a2c, dqn, ppo, rlx2, sac, spo, td3
from popjax.learners.base import Learner, LearnerDef

LEARNERS: dict[str, LearnerDef] = {d.name: d for d in (td3.DEFINITION, sac.DEFINITION, dqn.DEFINITION,
                                                  *spo.DEFINITIONS, ppo.DEFINITION, a2c.DEFINITION,
                                                  *rlx2.DEFINITIONS)}

__all__ = ["LEARNERS", "Learner", "LearnerDef"]
