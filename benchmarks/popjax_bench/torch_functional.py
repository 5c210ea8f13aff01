"""PyTorch TD3 and SAC as pure functions of one member's tensors: the compiled and vectorized baselines.

``torch_reference`` is PyTorch as most users write it (modules and ``torch.optim.Adam``, eager, one member
after another). The strongest PyTorch a user can write today is this module's functional form, in three
variants timed by the update study:

- ``torch_compile``: one member's step under ``torch.compile``, called member after member (the compiled
  single-file baselines' approach). The step takes the member's tensors as inputs, so every member reuses one
  compiled graph (compiling ``TorchTD3.update`` itself would specialise on each member's modules and fall
  back to eager past dynamo's cache limit).
- ``torch_vmap``: the step vectorized over members with ``torch.func.vmap`` (the fast-PBT paper's
  "Torch (Vectorized)": ``functional_call`` on stacked parameters), eager.
- ``torch_vmap_compile``: the same under ``torch.compile``.
- ``torch_vmap_cudagraph``: the same under ``torch.compile(mode="reduce-overhead")``: the compiled step
  captured as CUDA graphs and replayed, which removes the kernel launches that bound ``torch_vmap_compile`` on a
  GPU (what compiled single-file RL baselines use there). A replay writes its outputs into the graph's own
  memory, which the next replay overwrites, and each step's output state is the next step's input: so
  ``torch.compiler.cudagraph_mark_step_begin()`` before each call and a clone of what is kept (the state and
  the metrics), as PyTorch asks; the clones are part of the timed step. CUDA graphs need CUDA: on a CPU the
  variant falls back to ``torch.compile``'s default mode (the same program as ``torch_vmap_compile``) and
  says so (``update.cuda_graphs``, ``update.compile_mode``, recorded in the study's rows).

A member's state is a dict of tensors: ``params`` (per network, ``named_parameters`` names), Adam's moments
``m``/``v`` and step count ``t`` per optimiser; stacked states have a leading member axis. The steps are the
same arithmetic as ``torch_reference`` (Adam with eps outside the square root and bias corrections, TD3's
delayed actor and Polyak targets, SAC's critic -> actor -> alpha order with the pre-update alpha); the noise
is drawn outside, so all variants can be checked against one another and against the eager modules
(tests/test_bench.py). TD3's policy delay is the same for every member here (as the study's defaults are): the
caller counts steps and passes ``policy_step``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from popjax_bench import torch_reference as tr

torch = tr.torch
BETAS, EPS = (0.9, 0.999), 1e-8
if torch is not None:
    # Each (population size, TD3 step kind, learner) is one graph of the same function; past dynamo's default
    # limit of 8 it would fall back to eager silently and the "compiled" timings would be eager ones: allow
    # more graphs, and make hitting the limit an error.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.fail_on_recompile_limit_hit = True
VARIANTS = ("torch_compile", "torch_vmap", "torch_vmap_compile", "torch_vmap_cudagraph")
CUDA_GRAPH_MODE = "reduce-overhead"  # torch.compile's mode that captures CUDA graphs


def uses_cuda_graphs(variant: str, device: str) -> bool:
    """Whether ``variant`` runs as CUDA graphs on ``device`` (``torch_vmap_cudagraph`` on a CUDA device)."""
    return variant == "torch_vmap_cudagraph" and str(device).startswith("cuda")


def _params(module) -> dict[str, Any]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def _adam_state(params: dict[str, Any]) -> dict[str, Any]:
    zeros = {n: torch.zeros_like(p) for n, p in params.items()}
    device = next(iter(params.values())).device
    return {"m": zeros, "v": {n: torch.zeros_like(p) for n, p in params.items()}, "t": torch.zeros((), device=device)}


def _adam(params, grads, opt, lr):
    """One Adam step (``torch.optim.Adam``'s formula); returns ``(params, opt)``."""
    t = opt["t"] + 1
    c1, c2 = 1 - BETAS[0] ** t, 1 - BETAS[1] ** t
    m = {n: BETAS[0] * opt["m"][n] + (1 - BETAS[0]) * g for n, g in grads.items()}
    v = {n: BETAS[1] * opt["v"][n] + (1 - BETAS[1]) * g * g for n, g in grads.items()}
    new = {n: p - lr / c1 * m[n] / ((v[n] / c2).sqrt() + EPS) for n, p in params.items()}
    return new, {"m": m, "v": v, "t": t}


def _polyak(target, online, tau):
    return {n: (1 - tau) * target[n] + tau * online[n] for n in target}


def _call(module, params, *args):
    return torch.func.functional_call(module, params, args)


class TD3Functions:
    """TD3 as ``init_state(member)`` and ``step(state, batch, noise, hp, policy_step)`` over one member."""

    def __init__(self, member: tr.TorchTD3):
        self.actor = copy.deepcopy(member.actor).to("meta")  # structure only: parameters come as inputs
        self.critic = copy.deepcopy(member.critic).to("meta")
        self.q1 = copy.deepcopy(member.critic.q1).to("meta")  # the DPG loss reads critic 1 only

    @staticmethod
    def init_state(member: tr.TorchTD3) -> dict[str, Any]:
        params = {"actor": _params(member.actor), "critic": _params(member.critic),
                  "target_actor": _params(member.target_actor), "target_critic": _params(member.target_critic)}
        return {"params": params, "actor_opt": _adam_state(params["actor"]),
                "critic_opt": _adam_state(params["critic"])}

    def step(self, state, batch, noise, hp, policy_step: bool):
        """One TD3 step of one member (``TorchTD3.update``); ``hp``: tensors, ``policy_step``: static."""
        params = state["params"]
        obs, action, reward, next_obs, terminated = (batch[k] for k in ("obs", "action", "reward", "next_obs",
                                                                         "terminated"))
        smoothing = (hp["target_noise"] * noise).clamp(-hp["noise_clip"], hp["noise_clip"])
        next_action = (torch.tanh(_call(self.actor, params["target_actor"], next_obs)) + smoothing).clamp(-1.0, 1.0)
        next_q = _call(self.critic, params["target_critic"], next_obs, next_action).min(dim=0).values
        y = (reward + hp["discount"] * (1.0 - terminated) * next_q).detach()

        def critic_loss(critic):
            return ((_call(self.critic, critic, obs, action) - y) ** 2).mean(dim=-1).sum()

        loss, grads = _value_and_grad(critic_loss, params["critic"])
        critic, critic_opt = _adam(params["critic"], grads, state["critic_opt"], hp["critic_lr"])
        new = {**state, "params": {**params, "critic": critic}, "critic_opt": critic_opt}
        metrics = {"critic_loss": loss}
        if policy_step:
            q1 = {name[len("q1."):]: p for name, p in critic.items() if name.startswith("q1.")}

            def actor_loss(actor):
                a = torch.tanh(_call(self.actor, actor, obs))
                return -_call(self.q1, q1, torch.cat([obs, a], dim=-1))[..., 0].mean()

            metrics["actor_loss"], grads = _value_and_grad(actor_loss, params["actor"])
            actor, actor_opt = _adam(params["actor"], grads, state["actor_opt"], hp["actor_lr"])
            new["params"] = {"actor": actor, "critic": critic,
                             "target_actor": _polyak(params["target_actor"], actor, hp["tau"]),
                             "target_critic": _polyak(params["target_critic"], critic, hp["tau"])}
            new["actor_opt"] = actor_opt
        return new, metrics


class SACFunctions:
    """SAC as ``init_state(member)`` and ``step(state, batch, (noise_next, noise_actor), hp)``."""

    def __init__(self, member: tr.TorchSAC):
        self.actor = copy.deepcopy(member.actor).to("meta")
        self.critic = copy.deepcopy(member.critic).to("meta")
        self.action_dim = member.action_dim

    @staticmethod
    def init_state(member: tr.TorchSAC) -> dict[str, Any]:
        params = {"actor": _params(member.actor), "critic": _params(member.critic),
                  "target_critic": _params(member.target_critic), "log_alpha": member.log_alpha.detach().clone()}
        return {"params": params, "actor_opt": _adam_state(params["actor"]),
                "critic_opt": _adam_state(params["critic"]), "alpha_opt": _adam_state({"a": params["log_alpha"]})}

    def _sample(self, actor, obs, noise):
        mean, raw = _call(self.actor, actor, obs).chunk(2, dim=-1)
        lo, hi = tr.TorchSAC.log_std_min, tr.TorchSAC.log_std_max
        return tr.squashed_gaussian(mean, lo + 0.5 * (hi - lo) * (torch.tanh(raw) + 1), noise)

    def step(self, state, batch, noise, hp, policy_step: bool = True):
        """One SAC step of one member (``TorchSAC.update``); ``noise``: ``(next, actor)`` standard normals."""
        del policy_step  # every SAC step updates the actor
        params, (noise_next, noise_actor) = state["params"], noise
        obs, action, reward, next_obs, terminated = (batch[k] for k in ("obs", "action", "reward", "next_obs",
                                                                         "terminated"))
        alpha = params["log_alpha"].detach().exp()
        next_action, next_log_prob = self._sample(params["actor"], next_obs, noise_next)
        next_q = _call(self.critic, params["target_critic"], next_obs, next_action).min(dim=0).values
        y = (reward * hp["reward_scale"] + hp["discount"] * (1.0 - terminated) * (next_q - alpha * next_log_prob))
        y = y.detach()

        def critic_loss(critic):
            return 0.5 * ((_call(self.critic, critic, obs, action) - y) ** 2).mean(dim=-1).sum()

        c_loss, grads = _value_and_grad(critic_loss, params["critic"])
        critic, critic_opt = _adam(params["critic"], grads, state["critic_opt"], hp["critic_lr"])

        def actor_loss(actor):
            new_action, log_prob = self._sample(actor, obs, noise_actor)
            loss = (alpha * log_prob - _call(self.critic, critic, obs, new_action).min(dim=0).values).mean()
            return loss, log_prob

        (a_loss, log_prob), grads = _value_and_grad(actor_loss, params["actor"], has_aux=True)
        actor, actor_opt = _adam(params["actor"], grads, state["actor_opt"], hp["actor_lr"])
        target_entropy = -hp["target_entropy_scale"] * self.action_dim
        log_prob = log_prob.detach()

        def alpha_loss(log_alpha):
            return (-log_alpha["a"] * (log_prob + target_entropy)).mean()

        al_loss, grads = _value_and_grad(alpha_loss, {"a": params["log_alpha"]})
        log_alpha, alpha_opt = _adam({"a": params["log_alpha"]}, grads, state["alpha_opt"], hp["alpha_lr"])
        new_params = {"actor": actor, "critic": critic, "log_alpha": log_alpha["a"],
                      "target_critic": _polyak(params["target_critic"], critic, hp["tau"])}
        return ({"params": new_params, "actor_opt": actor_opt, "critic_opt": critic_opt, "alpha_opt": alpha_opt},
                {"critic_loss": c_loss, "actor_loss": a_loss, "alpha_loss": al_loss})


def _value_and_grad(fn, params, has_aux=False):
    """``(value, grads)`` of ``fn(params)`` with ``torch.func`` (composes with vmap and torch.compile)."""
    grads, value = torch.func.grad_and_value(fn, has_aux=has_aux)(params)
    return value, grads


FUNCTIONS = {"td3": TD3Functions, "sac": SACFunctions}


def stack(trees: list[Any]) -> Any:
    """Member trees -> one tree with a leading member axis."""
    return torch.utils._pytree.tree_map(lambda *xs: torch.stack(xs), *trees)


def unstack(tree: Any, n: int) -> list[Any]:
    return [torch.utils._pytree.tree_map(lambda x, i=i: x[i], tree) for i in range(n)]


def hparam_tensors(hp: dict[str, float], pop: int | None = None, device: str = "cpu") -> dict[str, Any]:
    """Hparams as float32 tensors: scalars, or ``[pop]`` (one per member) for the vectorized variants."""
    return {k: torch.full(() if pop is None else (pop,), float(v), device=device) for k, v in hp.items()}


def population(variant: str, fns, states: list[dict[str, Any]], hp: dict[str, float],
               device: str = "cpu", cuda_graphs: bool | None = None) -> Callable:
    """``update(batches, noises, policy_step) -> metrics`` for one population step of ``variant``.

    ``batches``/``noises``: per member (lists) for ``torch_compile``, stacked ``[pop, ...]`` for the vmap
    variants. The population's states live in the returned function (``update.holder["states"]``);
    ``update.compile_mode`` (None: eager) and ``update.cuda_graphs`` say what runs. ``cuda_graphs``: force the
    CUDA-graph bookkeeping of ``torch_vmap_cudagraph`` (default: on a CUDA device only; tests)."""
    pop = len(states)
    graphs = uses_cuda_graphs(variant, device) if cuda_graphs is None else cuda_graphs
    mode = None
    if variant == "torch_compile":
        mode = "default"
        step = torch.compile(fns.step, dynamic=False)
        hps = hparam_tensors(hp, device=device)
        holder = {"states": list(states)}

        def update(batches, noises, policy_step):
            out = []
            for i in range(pop):
                holder["states"][i], metrics = step(holder["states"][i], batches[i], noises[i], hps, policy_step)
                out.append(metrics)
            return out
    else:
        vstep = {flag: torch.func.vmap(lambda s, b, n, h, flag=flag: fns.step(s, b, n, h, flag))
                 for flag in (False, True)}
        if variant != "torch_vmap":
            mode = CUDA_GRAPH_MODE if graphs else "default"
            kwargs = {"mode": CUDA_GRAPH_MODE} if graphs else {}
            vstep = {flag: torch.compile(fn, dynamic=False, **kwargs) for flag, fn in vstep.items()}
        hps = hparam_tensors(hp, pop, device)
        holder = {"states": stack(states)}

        def update(batches, noises, policy_step):
            if graphs:  # this call's replay may overwrite the previous one's outputs: they were cloned
                torch.compiler.cudagraph_mark_step_begin()
            out = vstep[policy_step](holder["states"], batches, noises, hps)
            holder["states"], metrics = clone(out) if graphs else out
            return metrics
    update.holder = holder
    update.compile_mode = mode
    update.cuda_graphs = graphs
    return update


def clone(tree: Any) -> Any:
    """A copy of every tensor of ``tree`` (outputs of a CUDA-graph replay kept past the next replay)."""
    return torch.utils._pytree.tree_map(torch.clone, tree)
