"""The functional PyTorch baselines (``popjax_bench.torch_functional``) compute popjax's update.

Chain checked here: the functional step (eager, one member) equals the JAX learner's losses and the eager
``torch_reference`` modules' parameters; vmapped over members with different hparams it equals a loop of
members; under ``torch.compile`` it equals eager (``slow``: compiling takes about a minute). The update study
times them beside the eager baseline and names the fastest PyTorch variant at each N.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from popjax.learners import sac, td3
from popjax.learners.base import one_update
from popjax.types import EnvSpec, Transition
from popjax_bench import torch_reference as tr
from popjax_bench import update

pytestmark = pytest.mark.skipif(not tr.available(), reason=tr.TORCH_ERROR or "")
if tr.available():
    from popjax_bench import torch_functional as tf

    torch = tr.torch

SPEC = EnvSpec("t", (5,), action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3)


def _batch(rng, b=8):
    return Transition(rng.normal(size=(b, 5)).astype(np.float32), rng.uniform(-1, 1, (b, 3)).astype(np.float32),
                      rng.normal(size=b).astype(np.float32), rng.normal(size=(b, 5)).astype(np.float32),
                      (rng.uniform(size=b) < 0.2).astype(np.float32))


def _leaves(tree):
    return [x.detach().numpy() for x in torch.utils._pytree.tree_leaves(tree)]


def _assert_trees_close(a, b, atol):
    la, lb = _leaves(a), _leaves(b)
    assert len(la) == len(lb) and la
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_allclose(x, y, atol=atol, rtol=0)


def _module_params(member, names):
    return {name: (dict(getattr(member, name).named_parameters()) if name != "log_alpha" else member.log_alpha)
            for name in names}


def _torch_noise(key, shape):
    return torch.from_numpy(np.array(jax.random.normal(key, shape)))


def _three_ways(learner, hp, seed, module, load, functions):
    """One member three ways from the same JAX init: the jitted JAX state and step, the eager PyTorch module
    (``module``, loaded with ``load``) and the functional form (``functions``) with its state and hparams."""
    state = jax.jit(learner.init)(jax.random.key(seed), hp)
    member = module(5, 3, (16, 16), tr.hparams_dict(hp))
    load(member, state)
    fns = functions(member)
    return (state, jax.jit(one_update(learner)), member, fns, fns.init_state(member),
            tf.hparam_tensors(tr.hparams_dict(hp)))


def test_functional_td3_step_equals_the_jax_learner_and_the_eager_modules():
    hp = td3.default_hparams()  # policy_delay 2: steps 2 and 4 update the actor and targets
    state, step_fn, member, fns, functional, hps = _three_ways(td3.make_td3(td3.TD3Config(hidden=(16, 16)), SPEC),
                                                               hp, 0, tr.TorchTD3, tr.load_td3_from_jax,
                                                               tf.TD3Functions)
    rng = np.random.default_rng(0)
    for step in range(4):
        batch, key = _batch(rng), jax.random.key(100 + step)
        state, metrics = step_fn(key, state, batch, hp)
        noise = _torch_noise(key, batch.action.shape)  # the JAX learner's smoothing noise
        member.update(tr.batch_to_torch(batch, "cpu"), noise=noise)
        functional, out = fns.step(functional, tr.batch_to_torch(batch, "cpu"), noise, hps, step % 2 == 1)
        np.testing.assert_allclose(out["critic_loss"].item(), float(metrics["critic_loss"]), rtol=1e-4)
        if step % 2 == 1:
            np.testing.assert_allclose(out["actor_loss"].item(), float(metrics["actor_loss"]), rtol=1e-4)
        else:
            assert "actor_loss" not in out
    names = ("actor", "critic", "target_actor", "target_critic")
    _assert_trees_close({n: functional["params"][n] for n in names}, _module_params(member, names), atol=1e-6)
    jax_kernel = np.asarray(state.target_actor["params"]["MLP_0"]["Dense_1"]["kernel"]).T
    np.testing.assert_allclose(functional["params"]["target_actor"]["layers.1.weight"].numpy(), jax_kernel, atol=1e-5)
    assert functional["actor_opt"]["t"].item() == 2 and functional["critic_opt"]["t"].item() == 4


def test_functional_sac_step_equals_the_jax_learner_and_the_eager_modules():
    hp = sac.default_hparams()
    state, step_fn, member, fns, functional, hps = _three_ways(sac.make_sac(sac.SACConfig(hidden=(16, 16)), SPEC),
                                                               hp, 1, tr.TorchSAC, tr.load_sac_from_jax,
                                                               tf.SACFunctions)
    rng = np.random.default_rng(1)
    for step in range(3):
        batch, key = _batch(rng), jax.random.key(200 + step)
        key_next, key_actor = jax.random.split(key)  # the SAC learner's documented key split
        state, metrics = step_fn(key, state, batch, hp)
        noise = (_torch_noise(key_next, (8, 3)), _torch_noise(key_actor, (8, 3)))
        member.update(tr.batch_to_torch(batch, "cpu"), noise_next=noise[0], noise_actor=noise[1])
        functional, out = fns.step(functional, tr.batch_to_torch(batch, "cpu"), noise, hps)
        for name in ("critic_loss", "actor_loss", "alpha_loss"):
            np.testing.assert_allclose(out[name].item(), float(metrics[name]), rtol=1e-4, atol=1e-6)
    names = ("actor", "critic", "target_critic", "log_alpha")
    _assert_trees_close({n: functional["params"][n] for n in names}, _module_params(member, names), atol=1e-6)
    np.testing.assert_allclose(functional["params"]["log_alpha"].item(), float(state.log_alpha), atol=1e-6)


def _population(learner: str, pop: int = 3):
    torch.manual_seed(3)
    if learner == "td3":
        hp = tr.hparams_dict(td3.default_hparams())
        members = [tr.TorchTD3(5, 3, (16, 16), hp) for _ in range(pop)]
        fns = tf.TD3Functions(members[0])
    else:
        hp = tr.hparams_dict(sac.default_hparams())
        members = [tr.TorchSAC(5, 3, (16, 16), hp) for _ in range(pop)]
        fns = tf.SACFunctions(members[0])
    rng = np.random.default_rng(4)
    batches = [tr.batch_to_torch(_batch(rng), "cpu") for _ in range(pop)]
    draws = 1 if learner == "td3" else 2
    noises = [tuple(torch.randn(pop, 8, 3) for _ in range(draws)) for _ in range(4)]
    noises = [n[0] if draws == 1 else n for n in noises]
    return fns, [fns.init_state(m) for m in members], hp, batches, noises


def _loop(fns, states, hps, batches, noises, steps):
    """``steps`` population steps, member after member (eager); ``hps``: per-member hparam dicts."""
    states = list(states)
    for t in range(steps):
        for i in range(len(states)):
            noise = noises[t][i] if not isinstance(noises[t], tuple) else tuple(n[i] for n in noises[t])
            states[i], _ = fns.step(states[i], batches[i], noise, hps[i], t % 2 == 1)
    return states


@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_vmap_over_members_with_different_hparams_equals_a_loop(learner):
    fns, states, hp, batches, noises = _population(learner)
    lrs = (1e-4, 3e-4, 1e-3)
    per_member = [tf.hparam_tensors({**hp, "actor_lr": lr, "critic_lr": 2 * lr}) for lr in lrs]
    stacked_hp = {name: torch.stack([h[name] for h in per_member]) for name in per_member[0]}
    vstep = {flag: torch.func.vmap(lambda s, b, n, h, flag=flag: fns.step(s, b, n, h, flag)) for flag in (False, True)}
    stacked = tf.stack(states)
    for t in range(4):
        stacked, _ = vstep[t % 2 == 1](stacked, tf.stack(batches), noises[t], stacked_hp)
    looped = _loop(fns, states, per_member, batches, noises, 4)
    _assert_trees_close(tf.unstack(stacked, 3), looped, atol=1e-6)
    moved = [np.abs(_leaves(a)[0] - _leaves(b)[0]).max() for a, b in zip(looped, states, strict=True)]
    assert moved[0] < moved[2]  # the members' learning rates really differ


@pytest.mark.slow
@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_compiled_variants_equal_eager(learner):
    fns, states, hp, batches, noises = _population(learner)
    looped = _loop(fns, states, [tf.hparam_tensors(hp)] * 3, batches, noises, 4)
    for variant in ("torch_compile", "torch_vmap_compile", "torch_vmap_cudagraph"):
        update_fn = tf.population(variant, fns, states, hp)
        assert update_fn.compile_mode == "default" and not update_fn.cuda_graphs  # on the CPU: no CUDA graphs
        vectorized = variant != "torch_compile"
        for t in range(4):
            noise = noises[t] if vectorized else update._per_member(noises[t], 3, False)
            update_fn(tf.stack(batches) if vectorized else batches, noise, t % 2 == 1)
        out = update_fn.holder["states"]
        _assert_trees_close(tf.unstack(out, 3) if vectorized else out, looped, atol=1e-5)


class _FakeCompile:
    """``torch.compile`` recording its keyword arguments and each output it returns (the function runs eagerly)."""

    def __init__(self):
        self.kwargs, self.outputs = [], []

    def __call__(self, fn, **kwargs):
        self.kwargs.append(kwargs)

        def compiled(*args):
            out = fn(*args)
            self.outputs.append(out)
            return out

        return compiled


@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_cuda_graph_variant_marks_each_step_and_keeps_clones(learner, monkeypatch):
    """The bookkeeping CUDA graphs need, checked on the CPU with the graphs forced on (the capture itself needs
    CUDA): mode reduce-overhead, ``cudagraph_mark_step_begin`` before every call, and the kept state a clone of
    the step's output (a replay overwrites its outputs), equal to eager member after member."""
    fake, marks = _FakeCompile(), []
    monkeypatch.setattr(torch, "compile", fake)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(len(fake.outputs)))
    fns, states, hp, batches, noises = _population(learner)
    update_fn = tf.population("torch_vmap_cudagraph", fns, states, hp, cuda_graphs=True)
    assert update_fn.cuda_graphs and update_fn.compile_mode == "reduce-overhead"
    assert fake.kwargs == [{"dynamic": False, "mode": "reduce-overhead"}] * 2  # TD3's two step kinds; SAC uses one
    for t in range(4):
        update_fn(tf.stack(batches), noises[t], t % 2 == 1)
    assert marks == [0, 1, 2, 3]  # marked before each of the 4 calls, before its replay
    kept = torch.utils._pytree.tree_leaves(update_fn.holder["states"])
    replayed = torch.utils._pytree.tree_leaves(fake.outputs[-1][0])
    assert len(kept) == len(replayed) and all(k is not r and k.data_ptr() != r.data_ptr()
                                              for k, r in zip(kept, replayed, strict=True))
    looped = _loop(fns, states, [tf.hparam_tensors(hp)] * 3, batches, noises, 4)
    _assert_trees_close(tf.unstack(update_fn.holder["states"], 3), looped, atol=1e-6)


def test_cuda_graph_variant_falls_back_on_the_cpu(monkeypatch):
    """On a CPU device ``torch_vmap_cudagraph`` is ``torch.compile``'s default mode, without step marking or clones."""
    fake, marks = _FakeCompile(), []
    monkeypatch.setattr(torch, "compile", fake)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    fns, states, hp, batches, noises = _population("td3")
    update_fn = tf.population("torch_vmap_cudagraph", fns, states, hp, device="cpu")
    assert not update_fn.cuda_graphs and update_fn.compile_mode == "default"
    assert fake.kwargs == [{"dynamic": False}] * 2
    update_fn(tf.stack(batches), noises[0], False)
    assert marks == [] and update_fn.holder["states"] is fake.outputs[-1][0]  # kept as returned: no replay
    assert tf.uses_cuda_graphs("torch_vmap_cudagraph", "cuda:0") and not tf.uses_cuda_graphs("torch_vmap_compile",
                                                                                              "cuda")


@pytest.mark.parametrize("declined", [False, True])
def test_the_update_study_records_the_cuda_graph_fallback(declined, tmp_path, monkeypatch):
    """The study's rows of ``torch_vmap_cudagraph`` say what ran, and its notes say when it ran without CUDA graphs:
    on the CPU (no graphs, default mode), or with graphs asked for and PyTorch declining to capture them (its
    ``cudagraph_skips`` counter, bumped here by the fake compile as PyTorch does when it declines)."""
    from torch._dynamo.utils import counters

    from popjax_bench import common

    monkeypatch.setattr(common, "load_average", lambda: [0.1, 0.1, 0.1])
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.0)
    monkeypatch.setattr(common, "PEAK_N", 128)
    fake = _FakeCompile()
    if declined:
        monkeypatch.setattr(tf, "uses_cuda_graphs", lambda variant, device: True)

        def declining(fn, **kwargs):  # PyTorch compiles, and declines, at a graph's first call
            compiled, calls = fake(fn, **kwargs), []

            def call(*args):
                if not calls:
                    counters["inductor"]["cudagraph_skips"] += 1
                calls.append(1)
                return compiled(*args)

            return call

        monkeypatch.setattr(torch, "compile", declining)
    else:
        monkeypatch.setattr(torch, "compile", fake)
    payload = update.run(learners=("td3",), pops=(2,), impls=("torch_vmap_cudagraph",), hidden=(8,), batch_size=4,
                         k=2, torch_threads=(1,), repeats=10, min_time=0.0, out_dir=tmp_path, plot=False)
    written = json.loads((tmp_path / "update.json").read_text())
    (row,) = written["results"]
    assert row["impl"] == "torch_vmap_cudagraph" and row["cuda_graphs"] is False
    assert row["cuda_graph_skips"] == (2 if declined else 0)  # TD3's two step kinds
    assert row["torch_compile_mode"] == ("reduce-overhead" if declined else "default")
    assert row["torch_device"] == "cpu" and row["compile_s"] > 0
    assert fake.kwargs == [{"dynamic": False} | ({"mode": "reduce-overhead"} if declined else {})] * 2
    assert update.CUDA_GRAPH_FALLBACK in written["notes"] and payload["notes"] == written["notes"]


@pytest.mark.slow  # the accelerator test below runs the study with a PyTorch variant by default
def test_the_update_study_names_the_fastest_pytorch_variant(tmp_path, monkeypatch):
    from popjax_bench import common

    monkeypatch.setattr(common, "load_average", lambda: [0.1, 0.1, 0.1])
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.0)
    monkeypatch.setattr(common, "PEAK_N", 128)
    payload = update.run(learners=("td3",), pops=(2,), impls=("vmap", "torch_seq", "torch_vmap"), hidden=(16, 16),
                         batch_size=8, k=2, torch_threads=(1,), repeats=10, min_time=0.0, out_dir=tmp_path,
                         plot=False)
    rows = {r["impl"]: r for r in payload["results"]}
    assert set(rows) == {"vmap", "torch_seq", "torch_vmap"} and not any("skipped" in r for r in rows.values())
    fastest = min(("torch_seq", "torch_vmap"), key=lambda name: rows[name]["ms_per_pop_step"])
    vmap = rows["vmap"]
    assert vmap["torch_best"] == fastest
    assert vmap["speedup_vs_torch_best"] == pytest.approx(rows[fastest]["ms_per_pop_step"] / vmap["ms_per_pop_step"])
    assert vmap["speedup_vs_torch_vmap"] == pytest.approx(rows["torch_vmap"]["ms_per_pop_step"]
                                                          / vmap["ms_per_pop_step"])
    assert rows["torch_vmap"]["steps_per_call"] == 2 and rows["torch_vmap"]["compile"] is None  # eager: no compile


@pytest.mark.long
def test_the_accelerator_preset_runs_the_update_study_and_names_the_device(tmp_path, monkeypatch, capsys):
    """``popjax bench accelerator`` at tiny sizes on the CPU: the update study with the preset's learners, popjax's
    programs compiled ahead in threads (each once), every learner at one N before the next, one table printed at
    the end; written as update_<device>.json whose machine record names the device."""
    import threading

    from popjax import cli
    from popjax_bench import accelerator, common

    monkeypatch.setattr(common, "load_average", lambda: [0.1, 0.1, 0.1])
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.0)
    monkeypatch.setattr(common, "PEAK_N", 128)
    compiles, compile_timed = [], common.compile_timed

    def counted(fn, *args, **kwargs):
        compiles.append((threading.current_thread().name, len(args)))
        return compile_timed(fn, *args, **kwargs)

    monkeypatch.setattr(common, "compile_timed", counted)
    defaults = accelerator.Options()
    assert defaults.pops == (1, 4, 16, 64, 256) and defaults.learners == ("td3", "sac") and not defaults.memory_fit
    assert defaults.compile_workers > 1 and 0 < defaults.budget < 600  # the study's 10 minutes on one GPU
    code = cli.main(["bench", "accelerator", "--pop", "1,2", "--hidden", "8", "--batch-size", "4", "--k", "2",
                     "--impl", "vmap_scan,jax_seq,torch_vmap", "--torch-threads", "1", "--compile-workers", "2",
                     "--no-plot", "--min-time", "0", "--out", str(tmp_path)])
    assert code == 0
    assert accelerator.device_slug() == "cpu"
    payload = json.loads((tmp_path / "update_cpu.json").read_text())
    assert payload["study"] == "update" and payload["machine"]["devices"][0]["platform"] == "cpu"
    rows = [r for r in payload["results"] if "skipped" not in r]
    assert [(r["pop"], r["learner"]) for r in rows] == [(n, learner) for n in (1, 2) for learner in ("td3", "sac")
                                                        for _ in range(3)]
    # 2 learners x 2 N of vmap_scan + jax_seq's one program per learner, each compiled once, ahead, in threads (the
    # ceilings' matmuls, of 2 arguments, are compiled where they are measured; an update takes 4)
    popjax_programs = [thread for thread, arity in compiles if arity == 4]
    assert len(popjax_programs) == 6 and all(t.startswith("popjax-bench-compile") for t in popjax_programs)
    assert payload["params"]["compile_workers"] == 2 and any("compiled ahead" in n for n in payload["notes"])
    assert all(r["compile_s"] > 0 for r in rows if r["impl"] != "torch_vmap")
    assert all(r["torch_best"] == "torch_vmap" for r in rows)
    # both ceilings of the dominant layer at each N: XLA's batched dot and PyTorch's bmm (1 thread, as timed)
    torch_layers = payload["ceilings"]["torch_layers"]
    assert [(c["pop"], c["batch"], c["width"], c["threads"]) for c in torch_layers] == [
        (n, 4, 8, 1) for n in (1, 2) for _ in ("td3", "sac")]
    measured = {c["gflops"] for c in torch_layers}
    assert all(r["torch_layer_gflops"] in measured and r["layer_gflops"] > 0 for r in rows if r["impl"] == "vmap_scan")
    # one table at the end: each (learner, N) with every implementation, the fastest PyTorch and the speed-up
    table = capsys.readouterr().out.split("popjax bench accelerator: ms per population step")[1].splitlines()
    assert table[1].split() == ["learner", "N", "vmap_scan", "jax_seq", "torch_vmap", "fastest", "PyTorch",
                                "K-step", "speed-up"]
    by = {(r["learner"], r["impl"], r["pop"]): r["ms_per_pop_step"] for r in rows}
    cells = table[2].split()  # td3 at N = 1
    assert cells[:2] == ["td3", "1"] and cells[-2] == "torch_vmap"
    assert float(cells[-1].rstrip("x")) == pytest.approx(by["td3", "torch_vmap", 1] / by["td3", "vmap_scan", 1],
                                                         rel=0.01)
    assert [line.split()[:2] for line in table[2:6]] == [["td3", "1"], ["td3", "2"], ["sac", "1"], ["sac", "2"]]
    assert "skipped: none" in table


def test_the_accelerator_study_keeps_to_its_budget(tmp_path, monkeypatch, capsys):
    """Once ``--budget`` is spent the points not started are skipped, each with the reason, and listed at the end."""
    from popjax_bench import accelerator, common

    monkeypatch.setattr(common, "load_average", lambda: [0.1, 0.1, 0.1])
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.0)
    monkeypatch.setattr(common, "PEAK_N", 128)
    payload = accelerator.run(learners=("td3",), pops=(1, 2), impls=("vmap", "torch_vmap"), hidden=(8,), batch_size=4,
                              k=2, torch_threads=(1,), compile_workers=1, budget=1e-9, min_time=0.0, plot=False,
                              out_dir=str(tmp_path))
    assert [(r["impl"], r["pop"], r["skipped"]) for r in payload["results"]] == [
        (impl, n, "the study's --budget of 0s was spent" + (" (1 threads)" if impl == "torch_vmap" else ""))
        for n in (1, 2) for impl in ("vmap", "torch_vmap")]
    out = capsys.readouterr().out
    assert "skipped (4):" in out and "  td3 vmap N=2: the study's --budget of 0s was spent" in out


def test_torch_layer_ceiling_counts_the_bmm_flops():
    from types import SimpleNamespace

    row = update.torch_layer_gflops(3, 4, 5, 1, SimpleNamespace(seed=0, repeats=10, min_time=0.0))
    assert row["timing"]["repeats"] >= 10
    assert row["gflops"] == pytest.approx(2 * 3 * 4 * 5 * 5 / row["timing"]["median_s"] / 1e9)
