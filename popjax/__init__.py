"""popjax: train populations of deep-RL agents fast (pure learners, vmapped and jitted).

Public API::

    import popjax
    run = popjax.train(learner="td3", env="gym:Pendulum-v1", driver="pbt", pop_size=8,
                       total_env_steps=200_000, seed=0, out_dir="runs/pbt-td3")
    run.summary
    popjax.compare(["runs/pbt-td3", "runs/td3"], label="driver")   # IQM, CIs, P(improvement), plots
    popjax.sweep(learner="td3", env="probe:pendulum", pop_size=8, n_trials=32, out_dir="sweeps/td3")  # Optuna
"""

from popjax.comparison import compare, export_returns
from popjax.config import ConfigError, RunConfig, make_config
from popjax.experiment import Run, resume, train
from popjax.learners import LEARNERS
from popjax.sweeps import resume_sweep, sweep
from popjax.types import EnvSpec, Transition

__all__ = ["ConfigError", "EnvSpec", "LEARNERS", "Run", "RunConfig", "Transition", "compare", "export_returns",
           "make_config", "resume", "resume_sweep", "sweep", "train"]
__version__ = "0.1.0"
