"""Learner registry: name -> LearnerDef."""

from popjax.learners import dqn, rlx2, sac, spo, td3
from popjax.learners.base import Learner, LearnerDef

LEARNERS: dict[str, LearnerDef] = {d.name: d for d in (td3.DEFINITION, sac.DEFINITION, dqn.DEFINITION,
                                                  *spo.DEFINITIONS, rlx2.TD3_DEFINITION)}

__all__ = ["LEARNERS", "Learner", "LearnerDef"]
