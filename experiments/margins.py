"""The one margin rule of experiments/RESULTS.md and the rules of the issue-48 runs, declared before their data.

**The margin.** Every "matches" / "not worse than" claim is decided against ``-MARGIN_FRACTION`` of its env's
random-to-solved return range, ``margin(env) = MARGIN_FRACTION * (solved - random)``, on the env's own return
scale (so it does not depend on where the reward's zero lies) and the same for every claim on that env. A claim
normalised to that range uses ``-MARGIN_FRACTION`` directly. 0.1 is the one margin a source fixes: the ReF-ER
spec's §10 (c) "not worse than the baseline's normalised return - 0.1".

**Both measures.** A learning claim ("matches", "not worse than") is decided on the final return (mean of the last
evaluations) and on the learning speed (mean return over the evaluations after warm-up), each with
``stats.paired_verdict`` against the same margin; ``combine`` joins them: held only when both are held, refuted at
this scale when either is refuted, else not resolved. A held verdict whose baseline's mean final return lies within
one margin of ``solved`` is shown as **held (ceiling)**: the final return cannot tell the arms apart there. A
"matches" claim whose baseline has not learnt (``learnt``: its mean final return below the range's midpoint) is
not resolved: the margin is then as large as the returns themselves.

**Verdict words** (``SCOREBOARD_VERDICTS``): held, held (ceiling), refuted at this scale, not resolved, not run (a
row never run). results.py refuses any other word.

The ranges (``RANGES``; random: uniform random actions, 100 episodes, seeds 123.., measured by
``rlx2_pendulum.random_return`` / ``host_random_return`` and stored in results/margins/random_policy.json):

| env | random | solved | solved's source |
|---|---|---|---|
| probe:pendulum, gym:Pendulum-v1 | -1258 / -1290 | -150 | none in gymnasium: see (1) |
| probe:cartpole, gym:CartPole-v1 | 22.07 | 475 | gymnasium's ``reward_threshold`` for CartPole-v1 |
| gym:Hopper-v5 | 16.67 | 3800 | gymnasium's ``reward_threshold`` for Hopper-v5 |
| gym:HalfCheetah-v5 | -276.04 | 4800 | gymnasium's ``reward_threshold`` for HalfCheetah-v5 |
| gym:InvertedPendulum-v5 | 4.78 | 950 | gymnasium's ``reward_threshold`` for InvertedPendulum-v5 |

(1) -150 is the ReF-ER runs' "solved" constant (``refer_learning.NORMALISE``), within rl-baselines3-zoo's
benchmark.md (Pendulum: -146 to -202 for trained agents). probe:cartpole is the pure-JAX port of CartPole-v1 (500
steps); its random return is CartPole-v1's.
"""

from __future__ import annotations

from popjax import stats

MARGIN_FRACTION = 0.1
RANGES: dict[str, tuple[float, float]] = {
    "probe:pendulum": (-1258.36, -150.0),
    "gym:Pendulum-v1": (-1289.70, -150.0),
    "probe:cartpole": (22.07, 475.0),
    "gym:CartPole-v1": (22.07, 475.0),
    "gym:Hopper-v5": (16.67, 3800.0),
    "gym:HalfCheetah-v5": (-276.04, 4800.0),
    "gym:InvertedPendulum-v5": (4.78, 950.0),  # added for the MuJoCo parity pair, before its data
}
CEILING = "held (ceiling)"
NOT_RUN = "not run"
SCOREBOARD_VERDICTS = (stats.VERDICTS[0], CEILING, stats.VERDICTS[1], stats.VERDICTS[2], NOT_RUN)


def margin(env: str) -> float:
    """``MARGIN_FRACTION`` of ``env``'s random-to-solved range, in its return units (positive)."""
    if env not in RANGES:
        raise ValueError(f"env: {env!r} has no random-to-solved range (allowed: {', '.join(RANGES)})")
    low, high = RANGES[env]
    return MARGIN_FRACTION * (high - low)


def combine(final: str, speed: str) -> str:
    """One verdict from the final return's and the learning speed's: held when both hold, refuted at this scale
    when either is refuted, else not resolved."""
    if stats.VERDICTS[1] in (final, speed):
        return stats.VERDICTS[1]
    return stats.VERDICTS[0] if final == speed == stats.VERDICTS[0] else stats.VERDICTS[2]


# Added after the first re-derivation (MEMR on Hopper at 40k: SAC at 307 of a 3,783 range, under the 378 margin):
# a "matches" claim is not held while its baseline has not learnt, i.e. has not closed half its env's range.
LEARNT_FRACTION = 0.5


def learnt(env: str, base_final_mean: float) -> bool:
    """The baseline's mean final return is above the midpoint of ``env``'s random-to-solved range."""
    low, high = RANGES[env]
    return base_final_mean >= low + LEARNT_FRACTION * (high - low)


def at_ceiling(env: str, base_final_mean: float) -> bool:
    """The baseline's mean final return lies within one margin of the env's solved return."""
    return base_final_mean >= RANGES[env][1] - margin(env)


# --- rules of the issue-48 runs, fixed before their data --------------------------------------------------

# SPO naive local SGD at H = 1000 (spo_divergence.py --lr 1e-2 --buffer prioritized, 40 seeds per arm, tag
# drift40): a seed FAILS TO LEARN when its final return (mean of its last 3 evaluations) stays below the
# midpoint of probe:pendulum's random-to-solved range. Claim "naive local SGD fails to learn more often than
# two-phase": held when the one-sided Fisher exact test (naive fails more often) gives p < SPO_ALPHA; refuted at
# this scale when naive fails in no more seeds than two-phase; else not resolved.
SPO_FAIL_FRACTION = 0.5
SPO_ALPHA = 0.05


def spo_fails(final: float, env: str = "probe:pendulum") -> bool:
    low, high = RANGES[env]
    return not final >= low + SPO_FAIL_FRACTION * (high - low)


# MEMR with the learned model, the whole history as its model buffer (``memr_full``: model_buffer 1e8, capped at
# every rollout of the run) vs the default 1e5-rollout buffer (``memr``), probe:pendulum, 20k steps, 10 paired
# seeds (memr_pendulum.py --configs memr,memr_full --seeds 10 --tag whole_history). The docs' advice ("as large as
# memory allows") is a "beats" claim: memr_full - memr against 0 on both measures, combined by ``combine``.

# Parity with Stable-Baselines3 (parity_sb3.py): "popjax matches SB3" is a not-worse-than claim: popjax - SB3,
# paired by seed index (both sides evaluated from the same seeded start states), against -margin(env) on both
# measures, combined by ``combine``; shown as held (ceiling) under ``at_ceiling``.
