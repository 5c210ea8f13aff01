"""Learner registry: name -> LearnerDef."""

from popjax.learners import td3
from popjax.learners.base import Learner, LearnerDef

LEARNERS: dict[str, LearnerDef] = {d.name: d for d in (td3.DEFINITION,)}

__all__ = ["LEARNERS", "Learner", "LearnerDef"]
