"""Issue 48: the one margin, both measures, the verdict words, rules dated before their data, the SPO count and the
corrected prose figures, each against a hand computation or the committed JSON."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from popjax import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
try:
    import margins
    import verdicts
    from test_results import DOCUMENT, results, results_core, results_parity_crn_margins, results_rlx2
finally:
    sys.path.remove(str(ROOT / "experiments"))


def test_the_margin_is_a_tenth_of_the_random_to_solved_range():
    assert margins.margin("probe:pendulum") == pytest.approx(0.1 * (-150.0 + 1258.36))
    assert margins.margin("gym:CartPole-v1") == pytest.approx(0.1 * (475.0 - 22.07))
    measured = json.loads((ROOT / "experiments/results/margins/random_policy.json").read_text())["return"]
    for env, (low, _) in margins.RANGES.items():  # every random end is the committed measurement
        assert low == pytest.approx(measured.get(env, measured.get(env.replace("probe:cartpole", "gym:CartPole-v1"))),
                                    abs=0.01)
    with pytest.raises(ValueError, match="^env: 'gym:Ant-v5' has no random-to-solved range"):
        margins.margin("gym:Ant-v5")


def test_both_measures_must_pass_and_an_unlearnt_baseline_or_a_ceiling_is_named():
    held, not_resolved, refuted = "held", "not resolved", "refuted at this scale"
    assert margins.combine(held, held) == held
    assert margins.combine(held, not_resolved) == not_resolved == margins.combine(not_resolved, held)
    assert margins.combine(held, refuted) == refuted == margins.combine(refuted, not_resolved)
    a = np.array([10.0, 11.0, 9.0, 10.5, 9.5])
    far = (a - 1000.0, a)  # a − b = −1000: below any margin
    close = (a, a + 1.0)  # a − b = −1 exactly, SD 0 -> intervals are the point
    assert verdicts.both_measures(close, far, -50.0)[0] == refuted
    assert verdicts.both_measures(close, close, -50.0)[0] == held
    # Pendulum: −150 solved, margin 110.8; midpoint −704.2
    assert verdicts.both_measures(close, close, -50.0, "probe:pendulum", [-1000.0])[0] == not_resolved
    assert verdicts.both_measures(close, close, -50.0, "probe:pendulum", [-500.0])[0] == held
    assert verdicts.both_measures(close, close, -50.0, "probe:pendulum", [-200.0])[0] == "held (ceiling)"


def test_a_verdict_word_outside_the_five_is_refused(monkeypatch):
    data = results.load("scoreboard.json")
    claim = next(c for c in data["claims"] if not c.get("evidence"))
    monkeypatch.setattr(results, "load", lambda path, _real=results.load: (
        {**data, "claims": [{**claim, "verdict": "mostly held"}]} if path == "scoreboard.json" else _real(path)))
    with pytest.raises(ValueError, match=r"verdict 'mostly held' \(allowed: held, held \(ceiling\), refuted at this "
                                         r"scale, not resolved, not run\)"):
        results.scoreboard()


@pytest.mark.skipif(not verdicts.git_history(), reason="needs the repository's git history to date rules and data")
def test_a_rule_fixed_after_its_data_is_refused_unless_the_row_says_so(monkeypatch):
    data = results.load("scoreboard.json")
    claim = next(c for c in data["claims"] if c.get("evidence") == "hts_lag")
    assert claim["post_hoc"] is True  # the one margin (a8faafb) is newer than hts_learning.json
    assert not verdicts.rule_precedes_data(claim["rule_lines"], claim["data"])
    spo = next(c for c in data["claims"] if c.get("evidence") == "spo_fails_h1000")
    assert not spo.get("post_hoc") and verdicts.rule_precedes_data(spo["rule_lines"], spo["data"])

    def scoreboard_with(changed):
        monkeypatch.setattr(results, "load", lambda path, _real=results.load: (
            {**data, "claims": [changed]} if path == "scoreboard.json" else _real(path)))
        return results.scoreboard()

    with pytest.raises(ValueError, match="its rule was fixed after its data, but post_hoc is False"):
        scoreboard_with({**claim, "post_hoc": False})
    with pytest.raises(ValueError, match="its rule was fixed before its data, but post_hoc is True"):
        scoreboard_with({**spo, "post_hoc": True})
    with pytest.raises(ValueError, match="is not in experiments/margins.py"):
        scoreboard_with({**spo, "rule_lines": [["experiments/margins.py", "SPO_ALPHA = 0.01"]]})


def test_the_fails_to_learn_count_and_fisher_test_by_hand():
    midpoint = -1258.36 + 0.5 * (1258.36 - 150.0)
    assert margins.spo_fails(midpoint - 1) and not margins.spo_fails(midpoint + 1) and margins.spo_fails(np.nan)
    f = verdicts.fisher_fails([-1400.0] * 8 + [-150.0] * 12, [-150.0] * 20)
    # one-sided Fisher, table [[8, 12], [0, 20]]: P(X >= 8) = C(20,8) C(20,0) / C(40,8)
    assert (f["naive"], f["two_phase"]) == (8, 0) and f["p"] == pytest.approx(125970 / 76904685)
    assert f["verdict"] == "held"
    assert verdicts.fisher_fails([-1400.0, -150.0], [-1400.0, -150.0])["verdict"] == "refuted at this scale"
    records = results_core.runs("spo_divergence_drift40", lambda r: r["config"])
    committed = verdicts.fisher_fails(records["naive-local-1000"]["final"], records["two_phase-local-1000"]["final"])
    assert (committed["naive"], committed["two_phase"], round(committed["p"], 2)) == (1, 0, 0.5)


def test_the_issue48_prose_figures_come_from_the_json():
    scores = results_rlx2.rlx2_component_scores(0.9)
    mean = {k: float(np.mean(v)) for k, v in scores.items()}
    with_target, without = mean["rlx2"] - mean["rlx2_fixed_buffer"], mean["rlx2_1step"] - mean["rigl"]
    section = DOCUMENT.split("### RLx2's components")[1].split("\n## ")[0]
    assert f"costs −{-with_target:.0f} with the 3-step target and −{-without:.0f} without it (an interaction\n  of " \
           f"−{-(with_target - without):.0f} on the mean)" in section
    runs_ = {r["config"]: r for r in results.load("memr_pendulum/results_issue38.json")["runs"]}
    at = lambda arm, step: [ret for seed in runs_[arm]["curves"] for s, ret, _ in seed if s == step]
    memr = DOCUMENT.split("## MEMR re-run with the issue-38 setup")[1].split("\n## ")[0]
    assert f"shallower (−{-np.mean(at('memr_oracle_full', 6000)):.0f} at 6k)" in memr
    assert f"is at −{-min(at('memr_oracle_full', 6000)):.0f} at 6k (SAC's same seed falls to " \
           f"−{-at('sac', 7000)[1]:.0f} at 7k)" in memr and min(at("memr_oracle_full", 6000)) == at("memr_oracle_full",
                                                                                                    6000)[1]
    configs = results.load("memr_pendulum/results_issue38.json")["summary"]["configs"]
    assert results_core.t_beside(configs["memr_uniform"]["auc"], configs["memr_oracle"]["auc"]) == "; t [-15.2, 47.3]"
    assert "+16.1 with t [−15.2, 47.3]" in memr
    floor = json.loads((ROOT / "experiments/results/rlx2_compression_halfcheetah-v5" / "rlx2_floor_sample.json")
                       .read_text())
    assert floor["schedule"]["buffer_min"] == 2048 and "corrected from 833" in floor["correction"]
    assert min(min(s for s in m["replay_size"][next(i for i, v in enumerate(m["replay_size"]) if v >= 2000):])
               for m in floor["members"]) == 1845
    for f in ("results.json", "results_10seeds.json"):
        summary = json.loads((ROOT / "experiments/results/per_delay_cartpole" / f).read_text())["summary"]
        for c in summary["configs"].values():
            assert c["final_sd"] == pytest.approx(np.std(c["final_returns"], ddof=1))
    assert re.search(r"vectorisation factor N·t\(1\)/t\(N\) is 4\.7× at N = 16, 7\.8× at N = 64", DOCUMENT)


def test_parity_runs_share_evaluation_points_and_settings_with_the_presets():
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import parity_sb3
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    for pair in results_parity_crn_margins.parity_pairs():
        record = results.load(f"parity_sb3/{pair}.json")
        steps = record["popjax"]["eval_steps"]
        assert len(record["popjax"]["eval_seeds"]) == len(steps)
        for run in record["sb3"]["runs"]:  # SB3 scored at popjax's steps, after at least that many env steps
            assert [c[0] for c in run["curve"]] == steps and all(c[1] >= c[0] for c in run["curve"])
        # the SB3 side ran popjax's preset (a preset that changed since would no longer match)
        assert record["sb3"]["settings"] == json.loads(json.dumps(parity_sb3.sb3_settings(pair)))
        assert record["popjax"]["preset"] == json.loads(json.dumps(parity_sb3.preset(pair)))
    for ablation in results_parity_crn_margins.parity_pairs(results_parity_crn_margins.ABLATIONS):
        record = results.load(f"parity_sb3/{ablation}.json")
        base = results.load(f"parity_sb3/{record['variant']['base']}.json")
        if "sb3_init" in record["variant"]:  # new SB3 runs at the base's settings against the base's popjax runs
            assert record["popjax"] == base["popjax"] and record["sb3"]["settings"] == base["sb3"]["settings"]
        else:  # popjax's own settings against the base pair's SB3 runs
            assert record["popjax"]["preset"] == json.loads(json.dumps(parity_sb3.preset(ablation))) != \
                base["popjax"]["preset"]


def test_the_parity_prose_figures_come_from_the_json():
    section = DOCUMENT.split("## Parity with reference implementations")[1].split("\n## ")[0]

    def diff(pair, measure):
        s = results_parity_crn_margins.parity_scores(pair)
        a, b = s[measure]
        low, high = stats.t_interval(a - b)
        return float(np.mean(a - b)), f"; t [{results_core.num(low, 1)}, {results_core.num(high, 1)}]"

    text = lambda x: f"{x:+.1f}".replace("-", "−")
    speed, t = diff("td3_pendulum", "speed")
    assert f"({text(speed)} in speed, t [−40.2, 29.7])" in section and t == "; t [-40.2, 29.7]"
    final, speed = diff("dqn_cartpole", "final")[0], diff("dqn_cartpole", "speed")[0]
    assert f"popjax is behind on both means (final {text(final)}, speed {text(speed)})" in section
    speed, t = diff("dqn_cartpole_single_q", "speed")
    assert f"(speed {text(speed)}, t [−96.2, −22.9])" in section and t == "; t [-96.2, -22.9]"
    speed, t = diff("ppo_cartpole_halved_value", "speed")
    assert f"(speed\n  {text(speed)}, t [−51.0, 0.8]" in section and t == "; t [-51.0, 0.8]"
    speed, t = diff("ppo_cartpole", "speed")
    assert f"popjax's speed is {text(speed)} (t [−33.8, 10.4])" in section and t == "; t [-33.8, 10.4]"
    speed, t = diff("dqn_cartpole_sb3_lecun_init", "speed")
    assert f"(popjax − SB3 {text(speed)}, t [−52.0, 60.4])" in section and t == "; t [-52.0, 60.4]"
    sb3_own = results_parity_crn_margins.parity_scores("dqn_cartpole")["speed"][1]
    sb3_lecun = results_parity_crn_margins.parity_scores("dqn_cartpole_sb3_lecun_init")["speed"][1]
    assert f"moves SB3's mean speed by {text(float(np.mean(sb3_lecun - sb3_own)))}" in section
    final = results_parity_crn_margins.parity_scores("dqn_cartpole")["final"]
    assert f"finals\n  from {min(map(min, final)):.0f} to {max(map(max, final)):.0f}" in section
    (final, t_final), (speed, t_speed) = (diff("td3_inverted_pendulum", m) for m in ("final", "speed"))
    assert f"the gap is final {text(final)} (t [−299.1, 232.7]) and speed {text(speed)}\n  (t [−175.5, 137.1])" \
        in section and (t_final, t_speed) == ("; t [-299.1, 232.7]", "; t [-175.5, 137.1]")
    final, speed = diff("td3_inverted_pendulum_sb3_lecun_init", "final")[0], diff(
        "td3_inverted_pendulum_sb3_lecun_init", "speed")[0]
    assert f"(popjax − SB3 final {text(final)}, speed {text(speed)}, not\n    resolved)" in section
    own, lecun = (results_parity_crn_margins.parity_scores(p) for p in ("td3_inverted_pendulum",
                                                                         "td3_inverted_pendulum_sb3_lecun_init"))
    moves = [text(float(np.mean(lecun[m][1] - own[m][1]))) for m in ("final", "speed")]
    assert f"moves SB3's mean final by {moves[0]} and its speed by {moves[1]}," in section
    every_step = results_parity_crn_margins.popjax_only_scores("td3_inverted_pendulum_rollout1")
    at_50 = results_parity_crn_margins.popjax_only_scores("td3_inverted_pendulum")
    shown = [f"{np.mean(s[m]):.1f} ± {np.std(s[m], ddof=1):.1f}" for s in (every_step, at_50)
             for m in ("final", "speed")]
    assert (f"final {shown[0]} and speed {shown[1]} against {shown[2]}\n    and {shown[3]} at 50" in section)


def test_the_crn_prose_figures_come_from_the_json():
    d = results.load("eval_crn_pbt.json")
    member, common = d["summary"]["member"], d["summary"]["common"]
    section = DOCUMENT.split("## Common random numbers in evaluation")[1].split("\n## ")[0]
    assert f"(SD of f_i − f_j {member['pair_sd_mean']:.1f} → {common['pair_sd_mean']:.1f})" in section
    assert f"({member['member_sd_mean']:.1f} → {common['member_sd_mean']:.1f})" in section
    assert f"in {100 * member['replaced_differs_from_reference']:.0f} % of evaluations" in section
    assert f"and in\n  {100 * common['replaced_differs_from_reference']:.0f} % with common ones" in section
    ref = d["reference_fitness"]
    assert f"fitness −{-max(ref):.0f} to −{-min(ref):.0f})" in section
    fitness = {k: np.asarray(v) for k, v in d["fitness"].items()}  # the summary recomputes from the stored scores
    f = fitness["common"]
    pairs = [np.std(f[:, i] - f[:, j], ddof=1) for i in range(8) for j in range(i + 1, 8)]
    assert np.mean(pairs) == pytest.approx(common["pair_sd_mean"], rel=1e-5)
