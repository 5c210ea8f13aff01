"""``make results``: regenerates the tables of experiments/RESULTS.md from the committed JSON in experiments/results/
(and benchmarks/results/ for the speed tables). Never edit a generated table by hand: edit the function that
generates it.

A generated table sits between ``<!-- table: NAME -->`` and ``<!-- /table -->``; ``NAME`` is a function registered
with ``@table`` (``results_core.TABLES``): the scoreboard here, the other tables in the topic modules beside this
file (``results_speed_pbt_hts``, ``results_cemrl_dvd_spo``, ``results_rlx2``, ``results_refer``, ``results_memr``,
``results_parity_crn_margins``), which import ``results_core`` and no other topic module. This file holds the
scoreboard, ``EVIDENCE`` (the claims decided from their JSON, each by a function of its topic module), the renderer
and the command line.

Statistics (``popjax.stats``): SD with ddof 1 and n stated; arms that share seeds are compared with a **paired**
bootstrap (seeds redrawn jointly, 95 % percentile interval, 10 000 replicates, seed 0); with fewer than 4 seeds
no bootstrap interval (it would cover far less than 95 %), the per-seed values instead.

    python experiments/results.py            # rewrite experiments/RESULTS.md
    python experiments/results.py --check    # exit 1 when a committed table differs from what its JSON gives
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

import margins
import verdicts
from results_cemrl_dvd_spo import cemrl_order_evidence, spo_banked_evidence, spo_fails_evidence
from results_core import ROOT, TABLES, load, md, table
from results_memr import memr_evidence
from results_parity_crn_margins import PARITY, parity_evidence
from results_refer import refer_evidence, refer_pace_evidence
from results_rlx2 import rlx2_component_evidence, rlx2_s1_evidence
from results_speed_pbt_hts import hts_lag_evidence, pbt_paper_evidence, pbt_rs_evidence, r1_evidence

DOCUMENT = ROOT / "experiments" / "RESULTS.md"
BLOCK = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


@table
def scoreboard() -> list[str]:
    """Every seed-paper claim with its verdict, the rule that decides it, the scale it was tested at and where its
    numbers are (``results/scoreboard.json``). A claim with ``evidence`` is decided here, from its JSON, by
    ``EVIDENCE``; its committed verdict must be that one."""
    rows = []
    dated = verdicts.git_history()  # a shallow clone or an export cannot date rules and data
    for c in load("scoreboard.json")["claims"]:
        if c["verdict"] not in margins.SCOREBOARD_VERDICTS:
            raise ValueError(f"scoreboard.json: {c['claim']!r}: verdict {c['verdict']!r} (allowed: "
                             f"{', '.join(margins.SCOREBOARD_VERDICTS)})")
        if c["verdict"] == margins.NOT_RUN and (c.get("evidence") or c.get("data")):
            raise ValueError(f"scoreboard.json: {c['claim']!r}: 'not run' with evidence or data")
        shown = ""
        if c.get("evidence"):
            computed, shown = EVIDENCE[c["evidence"]]()
            if computed != c["verdict"]:
                raise ValueError(f"scoreboard.json: {c['claim']!r} says {c['verdict']!r} but its rule gives "
                                 f"{computed!r} ({shown})")
        if c.get("rule_lines") and dated:
            before = verdicts.rule_precedes_data(c["rule_lines"], c["data"])
            if before == bool(c.get("post_hoc")):
                raise ValueError(f"scoreboard.json: {c['claim']!r}: its rule was fixed "
                                 f"{'before' if before else 'after'} its data, but post_hoc is {c.get('post_hoc')}")
        where = ", ".join(f"[{x['title']}](#{x['anchor']})" if x["anchor"] else x["title"] for x in c["sections"])
        verdict = f"**{c['verdict']}**" + (" (rule fixed after its data)" if c.get("post_hoc") else "") + \
            (f": {shown}" if shown else "") + (f"; {c['detail']}" if c["detail"] else "")
        rows.append([c["paper"], c["claim"], verdict, c["rule"], scale_text(c["scale"]), where or "—"])
    return md(["paper", "claim", "verdict", "rule", "scale", "section"], rows)


def scale_text(scale: dict) -> str:
    return ", ".join(str(scale[k]) for k in ("env", "steps", "seeds", "budget") if scale.get(k) not in (None, ""))


EVIDENCE: dict[str, Callable[[], tuple[str, str]]] = {
    "hts_lag": hts_lag_evidence,
    "rlx2_s1_pendulum": rlx2_s1_evidence,
    "spo_banked_per": spo_banked_evidence,
    "spo_fails_h1000": spo_fails_evidence,
    "cemrl_order": cemrl_order_evidence,
    "rlx2_multistep": rlx2_component_evidence("the 3-step target"),
    "rlx2_dynamic_buffer": rlx2_component_evidence("the dynamic buffer"),
    "r1_gpu": r1_evidence,
    "r2_pendulum": pbt_rs_evidence("pendulum", "pbt", "random"),
    "r2_halfcheetah_25k": pbt_rs_evidence("halfcheetah-v5", "pbt", "random"),
    "r2_paper_defaults": pbt_paper_evidence("defaults"),
    "r2_paper_random": pbt_paper_evidence("random"),
    # MEMR: the issue-38 re-runs (the first setup's runs, results.json, stay in their sections)
    "memr_pendulum": memr_evidence("memr_pendulum/results_issue38.json", "memr", "sac", "probe:pendulum"),
    "memr_oracle_pendulum": memr_evidence("memr_pendulum/results_issue38.json", "memr_oracle", "sac", "probe:pendulum"),
    "memr_hopper": memr_evidence("memr_hopper/results_40k_issue38.json", "memr", "sac", "gym:Hopper-v5"),
    "memr_prioritized_pendulum": memr_evidence("memr_pendulum/results_issue38.json", "memr", "memr_uniform", None),
    "memr_prioritized_hopper": memr_evidence("memr_hopper/results_40k_issue38.json", "memr", "memr_uniform", None),
    "memr_whole_history": memr_evidence("memr_pendulum/results_whole_history.json", "memr_full", "memr", None),
    "refer_pendulum": refer_evidence("pendulum"),
    "refer_hopper": refer_evidence("hopper-v5"),
    "refer_pace_ddpg": refer_pace_evidence("refer", "ddpg"),
    "refer_pace_ddpg_d0.2": refer_pace_evidence("refer_d0.2", "ddpg"),
}
EVIDENCE.update({f"parity_{pair}": parity_evidence(pair) for pair in PARITY})


# --- the document ------------------------------------------------------------------------------------------

def render(text: str) -> str:
    """``text`` with every generated table rebuilt from its JSON; a block naming no table is a ValueError."""
    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise ValueError(f"table: {name!r} is not generated by experiments/results.py (allowed: "
                             f"{', '.join(TABLES)})")
        return match.group(1) + "\n".join(TABLES[name]()) + "\n" + match.group(4)

    return BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a table differs")
    args = parser.parse_args(argv)
    text = DOCUMENT.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{DOCUMENT}: generated tables differ from their JSON (run make results)", file=sys.stderr)
            return 1
        return 0
    if new != text:
        DOCUMENT.write_text(new)
    print(f"{DOCUMENT}: {len(BLOCK.findall(new))} tables regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
