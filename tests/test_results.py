"""The committed RESULTS tables are what their committed JSON gives (`make results` leaves them unchanged)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _results_modules():
    """experiments/results.py and the topic modules its tables live in (``results_<topic>``)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location("experiments_results", ROOT / "experiments" / "results.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        topics = [importlib.import_module(f"results_{topic}") for topic in
                  ("core", "cemrl_dvd_spo", "memr", "parity_crn_margins", "refer", "rlx2", "speed_pbt_hts")]
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    return module, *topics


(results, results_core, results_cemrl_dvd_spo, results_memr, results_parity_crn_margins, results_refer, results_rlx2,
 results_speed_pbt_hts) = _results_modules()
DOCUMENT = (ROOT / "experiments" / "RESULTS.md").read_text()


def test_every_generated_table_of_experiments_results_md_matches_its_json():
    assert results.render(DOCUMENT) == DOCUMENT, "experiments/RESULTS.md differs from its JSON: run make results"


def test_every_table_of_experiments_results_md_is_generated():
    names = [m.group(2) for m in results.BLOCK.finditer(DOCUMENT)]
    assert sorted(names) == sorted(results.TABLES)  # each generator is used once
    outside = results.BLOCK.sub("", DOCUMENT)
    assert not [line for line in outside.splitlines() if line.startswith(("| ", "|---"))], \
        "a table outside the generated blocks: hand-copied numbers"


def test_a_hand_edited_figure_is_caught():
    edited = DOCUMENT.replace("| 8 | 18.89 |", "| 8 | 319.4 |")  # the stale shared-critic figure the issue found
    assert edited != DOCUMENT and results.render(edited) == DOCUMENT
    with pytest.raises(ValueError, match="'nonesuch' is not generated"):
        results.render("<!-- table: nonesuch -->\n| x |\n<!-- /table -->")


def test_regenerated_figures_use_ddof_1_and_pair_seeds():
    block = re.search(r"<!-- table: cemrl_pendulum -->\n(.*?)<!-- /table -->", DOCUMENT, re.S).group(1)
    assert "-166, -134, -152 (**-151 ± 16**)" in block  # SD of the three finals with ddof 1 (ddof 0 gave 13)
    assert "n<4" in DOCUMENT and "95 % paired bootstrap of ratio" in DOCUMENT


def test_benchmarks_results_md_is_generated_from_its_json(tmp_path, monkeypatch):
    from popjax_bench import report

    monkeypatch.chdir(ROOT)  # the report names its inputs as given, relative to the repository
    out = report.write_report("benchmarks/results", tmp_path / "RESULTS.md", analysis_path="benchmarks/ANALYSIS.md",
                              targets_path="benchmarks/targets.yaml")
    expected = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    # image links are relative to the file's folder: compare with the committed file's
    assert out.read_text().replace(report._IMAGES["prefix"], "results") == expected


def test_ultimate_compression_ratio_by_hand():
    scores = {0.9: 97.0, 0.98: 96.9, 0.99: 99.0, 0.995: 50.0}
    assert results_rlx2.ucr(scores, 100.0) == 0.99  # the largest level within 3 % (a level below it may miss)
    assert results_rlx2.ucr({0.9: -103.0, 0.98: -104.0}, -100.0) == 0.9  # negative returns: 3 % of |dense|
    assert results_rlx2.ucr({0.9: 96.0}, 100.0) is None


def test_every_scoreboard_claim_has_a_three_level_verdict_its_rule_and_scale():
    claims = results.load("scoreboard.json")["claims"]
    assert {c["verdict"] for c in claims} <= {"held", "held (ceiling)", "refuted at this scale", "not resolved",
                                              "not run"}
    assert all(c["rule"] and c["scale"]["env"] for c in claims)
    computed = [c for c in claims if c.get("evidence")]
    assert len(computed) >= 10 and all(c["evidence"] in results.EVIDENCE for c in computed)


def test_a_scoreboard_verdict_that_its_rule_contradicts_is_refused(monkeypatch):
    data = results.load("scoreboard.json")
    claim = next(c for c in data["claims"] if c.get("evidence") == "refer_pendulum")
    # the final return alone is not resolved (the percentile interval alone would say refuted; t does not); the
    # learning speed is refuted by both intervals, and either measure refuted refutes the claim (issue 48)
    assert claim["verdict"] == "refuted at this scale"
    monkeypatch.setattr(results, "load", lambda path, _real=results.load: (
        {**data, "claims": [{**claim, "verdict": "not resolved"}]} if path == "scoreboard.json"
        else _real(path)))
    with pytest.raises(ValueError, match="its rule gives 'refuted at this scale'"):
        results.scoreboard()


def test_the_corrected_prose_numbers_come_from_the_json():
    assert "scores -269 to 492 (the defaults arm's lowest: -269, -205), and 92 of 120" in DOCUMENT
    assert "ranges 0.64-17.3 over every evaluation and seed" in DOCUMENT
    assert "10k +49 %" in DOCUMENT and "25k +29 %" in DOCUMENT and "55k -23 %" in DOCUMENT
    for stale in ("−125 to 492", "0.65-15", "within 15 % of each other"):
        assert stale not in DOCUMENT


def test_r1_is_decided_from_the_fp32_gpu_files():
    verdict, shown = results.EVIDENCE["r1_gpu"]()
    assert verdict == "held" and "209× at N = 16, 320× at N = 64" in shown
    assert "N·t(1)/t(N) is 4.7× at N = 16, 7.8× at N = 64" in shown and "47× is there at N = 1" in shown


def test_refer_pace_gaps_are_paired_by_seed_from_the_final_evaluations():
    arms = results_refer.refer_pace_runs()[16384]
    by_hand = [(r["eval_return"][-1] - t["eval_return"][-1]) / 1250  # normalised by (R + 1400) / 1250
               for r, t in zip(arms["refer"]["members"], arms["td3"]["members"], strict=True)]
    gap = results_refer.pace_gap(16384, "refer", "td3")
    assert gap == pytest.approx(by_hand) and round(gap[3], 2) == -0.86  # F2's seed 3: -1214 vs -141
    assert "T/N ≈ 3" in results_refer.pace_turnover(16384) and "T/N ≈ 12" in results_refer.pace_turnover(4096)


def test_the_memr_issue38_prose_numbers_come_from_the_json():
    """Every figure the issue-38 MEMR reading quotes, recomputed from the committed JSON (means of paired
    differences; the t-intervals as the tables compute them)."""
    import numpy as np

    new = results.load("memr_pendulum/results_issue38.json")["summary"]["configs"]
    first = results.load("memr_pendulum/results.json")["summary"]["configs"]

    def diff(configs, a, b, score="final"):
        return float(np.mean(np.subtract(configs[a][score], configs[b][score])))

    def text(x):
        return f"{x:+.1f}".replace("-", "−")

    quoted = {  # the prose's figure -> its value from the JSON
        "−172.8": diff(first, "memr", "sac"), "−54.8": diff(first, "memr_uniform", "sac"),
        "−117.9": diff(first, "memr", "memr_uniform"), "−4.9": diff(new, "memr", "sac"),
        "−10.5": diff(new, "memr_uniform", "sac"), "+5.6": diff(new, "memr", "memr_uniform"),
        "+0.1": diff(new, "memr_uniform", "memr_oracle"), "+16.1": diff(new, "memr_uniform", "memr_oracle", "auc"),
        "−86.4": diff(new, "memr_oracle", "sac", "auc"), "−34.0": diff(new, "memr_oracle_full", "sac", "auc"),
        "+10.6": diff(new, "memr_oracle_full", "memr_oracle"),
        "+52.4": diff(new, "memr_oracle_full", "memr_oracle", "auc"),
        "+17.3": diff(new, "memr_oracle_real", "memr_oracle_real_resampled", "auc"),
        "−15.6": diff(new, "memr_oracle_real", "sac", "auc")}
    section = DOCUMENT.split("## MEMR re-run with the issue-38 setup")[1].split("\n## ")[0]
    for figure, value in quoted.items():
        assert text(value) == figure and figure.lstrip("+") in section, figure
    assert "0.0, with t [−2.7, 2.6]" in section and results_core.t_beside(
        new["memr_oracle_full"]["final"], new["sac"]["final"]) == "; t [-2.7, 2.6]"
    assert "[13.9, 22.6], with t [10.1, 24.5]" in section
    assert "with t [−34.0, 2.9]" in section and results_core.t_beside(
        new["memr_oracle_real"]["auc"], new["sac"]["auc"]) == "; t [-34.0, 2.9]"
    oracle = next(r for r in results.load("memr_pendulum/results_issue38.json")["runs"] if r["config"] == "memr_oracle")
    at_6k = np.mean([[ret for step, ret, _ in seed if step == 6000] for seed in oracle["curves"]])
    assert f"to {text(at_6k)[:-2]} at 6k steps" in section  # the oracle arm's mid-run dip (mean of the seeds)


def test_the_rlx2_components_table_pairs_each_replica_with_rigl(tmp_path, monkeypatch):
    """With a component's records equal to RigL's, every per-replica difference is 0 and the scores are RigL's;
    without them the table says the run is missing."""
    import json
    import shutil

    folder = tmp_path / "rlx2_compression_halfcheetah-v5"
    shutil.copytree(results_rlx2.RESULTS / folder.name, folder)
    for method in (*results_rlx2.RLX2_COMPONENTS, *results_rlx2.RLX2_FLOOR):
        (folder / f"{method}.json").unlink(missing_ok=True)
    monkeypatch.setattr(results_rlx2, "RESULTS", tmp_path)
    assert results_rlx2.rlx2_components_halfcheetah() == ["Not run yet."]
    rigl = json.loads((folder / "rigl.json").read_text())
    for method in results_rlx2.RLX2_COMPONENTS:
        (folder / f"{method}.json").write_text(json.dumps(rigl))
    rows = [r for r in results_rlx2.rlx2_components_halfcheetah() if "without the multi-step" in r]
    expected = [m["score"] for m in rigl["members"] if m["sparsity"] == 0.9]
    assert len(rows) == 2 and results_core.seeds(expected) in rows[0] and "0, 0, 0 (mean 0" in rows[0]
    assert not [r for r in results_rlx2.rlx2_components_halfcheetah() if r.startswith("B_min = 2,048")]
    (folder / "rlx2_floor_sample.json").write_text((folder / "rlx2.json").read_text())
    (line,) = [r for r in results_rlx2.rlx2_components_halfcheetah() if r.startswith("B_min = 2,048")]
    assert "minus RLx2 (B_min = 833): 0, 0, 0 (mean 0; t [0, 0])" in line


def test_rlx2_main_effects_average_with_minus_without_over_the_other_component():
    scores = {"rigl": [0, 0], "rlx2_fixed_buffer": [2, 4], "rlx2_1step": [1, 1], "rlx2": [5, 3]}
    effects = {k: (w - wo).tolist() for k, (w, wo) in results_rlx2.rlx2_effects(scores).items()}
    # 3-step: ((2 - 0) + (5 - 1)) / 2 = 3 and ((4 - 0) + (3 - 1)) / 2 = 3; buffer: ((1 - 0) + (5 - 2)) / 2 = 2 and
    # ((1 - 0) + (3 - 4)) / 2 = 0
    assert effects == {"the 3-step target": [3.0, 3.0], "the dynamic buffer": [2.0, 0.0]}


def test_the_rlx2_components_prose_numbers_come_from_the_json():
    """The figures the reading of RLx2's components quotes: the 90 % means, the effects and the buffer's shrinks."""
    import itertools

    import numpy as np

    section = DOCUMENT.split("### RLx2's components")[1].split("\n## ")[0]
    scores = {m: np.asarray(v) for m, v in results_rlx2.rlx2_component_scores(0.9).items()}
    fixed, rigl, rlx2 = scores["rlx2_fixed_buffer"], scores["rigl"], scores["rlx2"]
    assert f"scores {fixed.mean():,.0f} on the mean" in section
    assert f"ahead of RigL on all {np.sum(fixed > rigl)} replicas (+{results_core.num(fixed.mean() - rigl.mean())})" \
        in section
    assert f"gives RLx2, at {results_core.num(rlx2.mean())}: lower on all {np.sum(rlx2 < fixed)} replicas" in section
    dense = [m["score"] for m in results.load(f"{results_rlx2.RLX2_FOLDER}/dense.json")["members"]]
    assert f"dense TD3's {results_core.num(np.mean(dense))} on the mean" in section
    effects = {k: w - wo for k, (w, wo) in results_rlx2.rlx2_effects(scores).items()}
    buffer, target = effects["the dynamic buffer"], effects["the 3-step target"]
    assert f"main effect is −{results_core.num(-buffer.mean())} and negative on all {np.sum(buffer < 0)}" in section
    assert f"the 3-step target's is +{results_core.num(target.mean())},\n  positive on {np.sum(target > 0)} of 3" \
        in section
    members = [m for method in ("rlx2", "rlx2_1step")
               for m in results.load(f"{results_rlx2.RLX2_FOLDER}/{method}.json")["members"] if m["sparsity"] == 0.9]
    shrinks = [m["shrinks"] for m in members]
    assert f"shrank {min(shrinks)}–{max(shrinks)} times" in section
    schedule = results.load(f"{results_rlx2.RLX2_FOLDER}/rlx2.json")["schedule"]
    period, capacity = schedule["period"], schedule["buffer_size"]
    longest = []
    for m in members:
        sizes, run, best = m["replay_size"], 0, 0
        for before, now in itertools.pairwise(sizes):
            run = run + 1 if now < min(before + period, capacity) else 0  # a check that dropped rows
            best = max(best, run)
        longest.append(best)
    assert f"up\n  to {max(longest)} in a row" in section
    held = [np.mean([size for (step, _), size in zip(m["curve"], m["replay_size"], strict=True) if step > capacity])
            for m in members]
    assert f"(after {capacity:,} steps) they held {min(held):,.0f}–{max(held):,.0f} rows on average" in \
        section.replace("\n  ", " ")
    flat = " ".join(section.split())
    at_98 = results_rlx2.rlx2_component_scores(0.98)
    assert f"between the random policy's −276 and {results_core.num(max(np.mean(v) for v in at_98.values()))}" in flat
    floor_record = results.load(f"{results_rlx2.RLX2_FOLDER}/rlx2_floor_sample.json")
    floor = scores["rlx2_floor_sample"]
    assert f"({floor_record['total_s']:,.0f} s)" in flat
    low, high = results_core.stats.t_interval(floor - fixed)
    assert (f"scores {floor.mean():,.0f} on the mean: level with the "
            f"fixed buffer's {fixed.mean():,.0f} (−{results_core.num(fixed.mean() - floor.mean())} on the mean, t "
            f"[{results_core.num(low).replace('-', '−')}, {results_core.num(high)}])") in flat
    assert (f"+{results_core.num(floor.mean() - rlx2.mean())} over RLx2 (ahead on {np.sum(floor > rlx2)} of 3 replicas)"
            in flat)
    floor_shrinks = [m["shrinks"] for m in floor_record["members"] if m["sparsity"] == 0.9]
    assert f"still shrank {min(floor_shrinks)}–{max(floor_shrinks)} times" in flat


def test_the_spo_drift_prose_numbers_come_from_the_json():
    import numpy as np

    runs = results_core.runs("spo_divergence_drift", lambda r: r["config"])
    naive, two_phase = runs["naive-local-1000"], runs["two_phase-local-1000"]
    spread = np.asarray([s for m in naive["spreads"] for s in m], dtype=float)[:, 1]
    section = DOCUMENT.split("### At real drift")[1].split("\n## ")[0]
    assert f"reaches {np.nanmax(spread):.3f} (mean {np.nanmean(spread):.3f})" in section
    never = [i for i, c in enumerate(naive["curves"]) if max(ret for _, ret in c) < -1000]  # never learnt
    assert never == [4, 6] and not any(naive["diverged"])
    assert all(max(ret for _, ret in c) > -1000 for c in two_phase["curves"])
    last = [round(naive["curves"][i][-1][1]) for i in never]
    scores = [round(naive["final"][i]) for i in never]  # the mean of the last 3 evaluations
    assert f"their last evaluations are −{-last[0]} and −{-last[1]} and their scores (the\n  mean of the last 3) " \
        f"−{-scores[0]} and −{-scores[1]}" in section
    grid = results_cemrl_dvd_spo.spo_divergence_records().values()
    critic_max = max(np.nanmax(np.asarray([s for m in r["spreads"] for s in m], dtype=float)[:, 1]) for r in grid)
    actor_mean = max(np.nanmean(np.asarray([s for m in r["spreads"] for s in m], dtype=float)[:, 2]) for r in grid)
    assert f"a maximum of {critic_max:.3f} in the grid" in section and "was the\n  actor's largest mean" in section
    assert round(actor_mean, 3) == 0.018
    gain = np.mean(np.subtract(two_phase["final"], naive["final"]))
    assert f"+{gain:.0f}, with percentile [2, 635] and t [−112, 645]" in section
    assert "| 266 (percentile [2, 635], t [-112, 645], n = 10)" in DOCUMENT  # the generated table says the same


def test_the_memr_hopper_before_after_figures_come_from_the_json():
    """The first Hopper run cut at 60k is its own summary (the cut is exact), and the section's before/after
    figures at 40k recompute from the two runs' JSON."""
    import numpy as np

    first = results.load("memr_hopper/results.json")["summary"]["configs"]
    whole = results_memr.memr_scores_until("memr_hopper/results.json", 60_000)
    assert all(np.allclose(first[arm][s], whole[arm][s]) for arm in first for s in ("final", "auc"))
    at_40k = results_memr.memr_scores_until("memr_hopper/results.json", 40_000)
    new = results.load("memr_hopper/results_40k_issue38.json")["summary"]["configs"]

    def diff(configs, a, b):
        return f"{np.mean(np.subtract(configs[a]['final'], configs[b]['final'])):.1f}".replace("-", "−")

    section = " ".join(DOCUMENT.split("### gym:Hopper-v5, 40k env steps (issue 38)")[1].split("\n## ")[0].split())
    assert f"moved from {diff(at_40k, 'memr', 'sac')} in the first setup to {diff(new, 'memr', 'sac')} here" in section
    assert f"from {diff(at_40k, 'memr_uniform', 'sac')} to {diff(new, 'memr_uniform', 'sac')}" in section
    assert f"on the mean ({diff(new, 'memr', 'memr_uniform')})" in section
    assert f"margin ({-0.1 * abs(np.mean(new['sac']['final'])):.1f})".replace("-", "−") in section
    walls = [round(new[arm]["total_s"]) for arm in ("sac", "memr_uniform", "memr")]
    assert "took {:,} + {:,} + {:,} s, about {:.0f} minutes".format(*walls, sum(walls) / 60) in section


def test_the_r2_paper_prose_numbers_come_from_the_json():
    """The counts and ranges the reading of R2 as the paper states it quotes, from the re-scored returns."""
    import numpy as np

    section = " ".join(DOCUMENT.split("## R2 as the paper states it")[1].split("\n## ")[0].split())
    seed_ids, score = results_speed_pbt_hts.pbt_paper_scores()
    n = len(seed_ids)
    assert f"**Seeds 0-{max(seed_ids)} finished**" in section
    assert f"worse in {np.sum(score['pbt'] < score['defaults'])} of {n} seeds (all but seed 0)" in section
    assert score["pbt"][0] > score["defaults"][0]
    assert f"ahead in {np.sum(score['pbt'] > score['random'])} of {n} seeds but behind on the mean" in section
    assert score["pbt"].mean() < score["random"].mean()
    best = np.argmax(score["random"])
    assert score["random"][best] == max(s.max() for s in score.values())  # "the best score of any arm"
    assert (f"Seed {seed_ids[best]}'s random search drew a member that re-scores {score['random'][best]:,.0f}"
            in section and f"PBT's seed {seed_ids[best]} reached {score['pbt'][best]:,.0f}" in section)
    assert score["defaults"].min() >= 1500 and "every seed re-scores at 1,500 or more" in section
    searched = np.concatenate([score["pbt"], score["random"]])
    assert f"range from {searched.min():,.0f} to {searched.max():,.0f}" in section
