import math

from popjax.rundir import RunDir


def test_new_columns_extend_the_header_without_losing_rows(tmp_path):
    rd = RunDir(tmp_path)
    rd.append_metrics([{"env_steps": 100, "member": 0, "eval_return": -5.0}])
    rd.append_metrics([{"env_steps": 200, "member": 0, "eval_return": -4.0, "critic_loss": 0.5}])
    rd.append_metrics([{"env_steps": 300, "member": 0, "eval_return": float("nan"), "critic_loss": 0.25}])
    assert rd.metric_columns() == ["env_steps", "member", "eval_return", "critic_loss"]
    rows = rd.read_metrics()
    assert [r["env_steps"] for r in rows] == [100, 200, 300]
    assert math.isnan(rows[0]["critic_loss"]) and rows[1]["critic_loss"] == 0.5
    assert math.isnan(rows[2]["eval_return"]) and rows[2]["critic_loss"] == 0.25


def test_truncate_drops_only_later_rows(tmp_path):
    rd = RunDir(tmp_path)
    rd.append_metrics([{"env_steps": s, "member": m, "eval_return": float(s + m)} for s in (1, 2, 3) for m in (0, 1)])
    rd.truncate_metrics(2)
    assert [(r["env_steps"], r["member"]) for r in rd.read_metrics()] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    rd.append_metrics([{"env_steps": 3, "member": 0, "eval_return": 9.0}])
    assert [r["eval_return"] for r in rd.read_metrics()][-1] == 9.0
