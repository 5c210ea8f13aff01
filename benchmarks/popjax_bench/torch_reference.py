"""PyTorch reference learners for the "Torch (Sequential)" baseline of the fast-PBT paper.

The same networks, losses and update order as popjax's JAX learners (``popjax/learners``),
written the way a PyTorch user would (one ``nn.Module`` and one ``torch.optim.Adam`` per
network, one member updated after another, one gradient step per call):

- TD3: ReLU MLPs, twin critics, one smoothing-noise draw per step for both critics, critic
  loss = sum over critics of the batch-mean squared TD error, DPG through critic 1 on
  ``obs``; actor and all targets (Polyak) updated on policy steps only. Unlike the JAX
  learner (which computes the actor step every step and selects, because the delay is a
  traced per-member hparam), a PyTorch TD3 skips the actor work on the other steps: that is
  the baseline users compare against, and it does less arithmetic (reported by the update
  study as ``torch_flop_ratio``).
- SAC: tanh-squashed Gaussian with the same log-std squashing and numerically stable
  log-det, critic -> actor -> alpha order, pre-update alpha everywhere, Polyak every step.
- DQN: Nature CNN (NCHW, uint8 frames cast to float), double-Q target, Huber(1) loss,
  hard target copy every ``target_update_period`` updates.

Gradient work equals the JAX learners': the actor loss backpropagates only into the actor's
parameters (``backward(inputs=...)``), as ``jax.grad`` w.r.t. the actor does.

``load_*_from_jax`` copy JAX parameters into the modules so that tests can check that both
implementations compute the same losses (tests/test_bench.py).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    import torch
    from torch import nn

    TORCH_ERROR: str | None = None
except ImportError as _err:  # optional dependency: popjax-bench's `torch` extra
    torch = None
    nn = None
    TORCH_ERROR = (
        f"PyTorch is not installed ({_err}); install popjax-bench's torch extra "
        "(pip install -e './benchmarks[torch]', i.e. torch==2.13.0) for the PyTorch baseline"
    )

# torch's own default intra-op thread count (the number of cores), before anyone changes it.
DEFAULT_THREADS = torch.get_num_threads() if torch is not None else None
_LOG2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def available() -> bool:
    return torch is not None


def device() -> str:
    """CUDA when PyTorch sees a GPU, else CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def _adam(params, lr: float):
    # foreach=True: the multi-tensor implementation (PyTorch's default on CUDA), also on CPU.
    return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, foreach=True)


if torch is not None:

    class MLP(nn.Module):
        """ReLU MLP with a linear output layer (popjax.networks.mlp.MLP)."""

        def __init__(self, dims: Sequence[int]):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))

        def forward(self, x):
            for layer in self.layers[:-1]:
                x = torch.relu(layer(x))
            return self.layers[-1](x)

    class TwinCritic(nn.Module):
        def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int]):
            super().__init__()
            dims = [obs_dim + action_dim, *hidden, 1]
            self.q1 = MLP(dims)
            self.q2 = MLP(dims)

        def forward(self, obs, action):
            x = torch.cat([obs, action], dim=-1)
            return torch.stack([self.q1(x)[..., 0], self.q2(x)[..., 0]])

        def q1_only(self, obs, action):
            return self.q1(torch.cat([obs, action], dim=-1))[..., 0]

    class NatureQNetwork(nn.Module):
        """Nature CNN torso + MLP head; frames arrive NCHW uint8 and are cast to float32."""

        def __init__(self, num_actions: int, hidden: Sequence[int], in_channels: int = 4, size: int = 84):
            super().__init__()
            self.convs = nn.ModuleList(
                [
                    nn.Conv2d(in_channels, 32, 8, stride=4),
                    nn.Conv2d(32, 64, 4, stride=2),
                    nn.Conv2d(64, 64, 3, stride=1),
                ]
            )
            side = ((size - 8) // 4 + 1 - 4) // 2 + 1 - 2
            self.head = MLP([64 * side * side, *hidden, num_actions])

        def forward(self, x):
            x = x.float()
            for conv in self.convs:
                x = torch.relu(conv(x))
            # Flatten in (H, W, C) order, as flax's NHWC reshape does, so weights are interchangeable.
            return self.head(x.permute(0, 2, 3, 1).flatten(1))


def _polyak(target: nn.Module, online: nn.Module, tau: float) -> None:
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


class TorchTD3:
    """One TD3 member (popjax.learners.td3 semantics; see the module docstring)."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: Sequence[int],
        hparams: dict[str, float],
        dev: str = "cpu",
    ):
        self.hp = dict(hparams)
        self.dev = dev
        self.actor = MLP([obs_dim, *hidden, action_dim]).to(dev)
        self.critic = TwinCritic(obs_dim, action_dim, hidden).to(dev)
        self.target_actor = copy.deepcopy(self.actor)
        self.target_critic = copy.deepcopy(self.critic)
        for p in (*self.target_actor.parameters(), *self.target_critic.parameters()):
            p.requires_grad_(False)
        self.actor_opt = _adam(self.actor.parameters(), self.hp["actor_lr"])
        self.critic_opt = _adam(self.critic.parameters(), self.hp["critic_lr"])
        self.steps = 0

    def policy(self, obs):
        return torch.tanh(self.actor(obs))

    def update(self, batch: dict[str, Any], noise: Any = None) -> dict[str, float | None]:
        """One gradient step. ``noise``: standard-normal draws ``[B, action_dim]`` (else torch.randn)."""
        hp = self.hp
        obs, action, reward, next_obs, terminated = (
            batch[k] for k in ("obs", "action", "reward", "next_obs", "terminated")
        )
        with torch.no_grad():
            eps = torch.randn_like(action) if noise is None else noise
            smoothing = (hp["target_noise"] * eps).clamp(-hp["noise_clip"], hp["noise_clip"])
            next_action = (torch.tanh(self.target_actor(next_obs)) + smoothing).clamp(-1.0, 1.0)
            next_q = self.target_critic(next_obs, next_action).min(dim=0).values
            y = reward + hp["discount"] * (1.0 - terminated) * next_q
        q = self.critic(obs, action)
        critic_loss = ((q - y) ** 2).mean(dim=-1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        self.steps += 1
        actor_loss = None
        if self.steps % int(hp["policy_delay"]) == 0:
            params = list(self.actor.parameters())
            loss = -self.critic.q1_only(obs, self.policy(obs)).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            loss.backward(inputs=params)
            self.actor_opt.step()
            _polyak(self.target_actor, self.actor, hp["tau"])
            _polyak(self.target_critic, self.critic, hp["tau"])
            actor_loss = loss
        return {
            "critic_loss": critic_loss.detach(),
            "actor_loss": None if actor_loss is None else actor_loss.detach(),
        }


def squashed_gaussian(mean, log_std, noise):
    """Same formula as popjax.learners.sac.squashed_gaussian."""
    u = mean + torch.exp(log_std) * noise
    gaussian_log_prob = -0.5 * noise**2 - log_std - _HALF_LOG_2PI
    log_det = 2.0 * (_LOG2 - u - torch.nn.functional.softplus(-2.0 * u))
    return torch.tanh(u), (gaussian_log_prob - log_det).sum(dim=-1)


class TorchSAC:
    """One SAC member (popjax.learners.sac semantics)."""

    log_std_min, log_std_max = -5.0, 2.0

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: Sequence[int],
        hparams: dict[str, float],
        dev: str = "cpu",
    ):
        self.hp = dict(hparams)
        self.dev = dev
        self.action_dim = action_dim
        self.actor = MLP([obs_dim, *hidden, 2 * action_dim]).to(dev)
        self.critic = TwinCritic(obs_dim, action_dim, hidden).to(dev)
        self.target_critic = copy.deepcopy(self.critic)
        for p in self.target_critic.parameters():
            p.requires_grad_(False)
        self.log_alpha = torch.zeros((), device=dev, requires_grad=True)
        self.actor_opt = _adam(self.actor.parameters(), self.hp["actor_lr"])
        self.critic_opt = _adam(self.critic.parameters(), self.hp["critic_lr"])
        self.alpha_opt = _adam([self.log_alpha], self.hp["alpha_lr"])
        self.steps = 0

    def sample(self, obs, noise):
        mean, raw = self.actor(obs).chunk(2, dim=-1)
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (torch.tanh(raw) + 1)
        return squashed_gaussian(mean, log_std, torch.randn_like(mean) if noise is None else noise)

    def update(self, batch: dict[str, Any], noise_next: Any = None, noise_actor: Any = None):
        hp = self.hp
        obs, action, reward, next_obs, terminated = (
            batch[k] for k in ("obs", "action", "reward", "next_obs", "terminated")
        )
        alpha = self.log_alpha.detach().exp()
        target_entropy = -hp["target_entropy_scale"] * self.action_dim
        with torch.no_grad():
            next_action, next_log_prob = self.sample(next_obs, noise_next)
            next_q = self.target_critic(next_obs, next_action).min(dim=0).values
            y = reward * hp["reward_scale"] + hp["discount"] * (1.0 - terminated) * (next_q - alpha * next_log_prob)
        q = self.critic(obs, action)
        critic_loss = 0.5 * ((q - y) ** 2).mean(dim=-1).sum()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        actor_params = list(self.actor.parameters())
        new_action, log_prob = self.sample(obs, noise_actor)
        actor_loss = (alpha * log_prob - self.critic(obs, new_action).min(dim=0).values).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=actor_params)
        self.actor_opt.step()

        alpha_loss = (-self.log_alpha * (log_prob.detach() + target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        _polyak(self.target_critic, self.critic, hp["tau"])
        self.steps += 1
        return {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "alpha_loss": alpha_loss.detach(),
        }


class TorchDQN:
    """One DQN member (popjax.learners.dqn semantics, Nature CNN, double Q, Huber)."""

    def __init__(
        self,
        num_actions: int,
        hidden: Sequence[int],
        hparams: dict[str, float],
        target_update_period: int = 500,
        double_q: bool = True,
        dev: str = "cpu",
        frame: int = 84,
    ):
        self.hp = dict(hparams)
        self.dev = dev
        self.q = NatureQNetwork(num_actions, hidden, size=frame).to(dev)
        self.target_q = copy.deepcopy(self.q)
        for p in self.target_q.parameters():
            p.requires_grad_(False)
        self.opt = _adam(self.q.parameters(), self.hp["lr"])
        self.period = target_update_period
        self.double_q = double_q
        self.steps = 0

    def update(self, batch: dict[str, Any]):
        hp = self.hp
        obs, action, reward, next_obs, terminated = (
            batch[k] for k in ("obs", "action", "reward", "next_obs", "terminated")
        )
        with torch.no_grad():
            next_q_target = self.target_q(next_obs)
            if self.double_q:
                next_action = self.q(next_obs).argmax(dim=-1, keepdim=True)
            else:
                next_action = next_q_target.argmax(dim=-1, keepdim=True)
            next_q = next_q_target.gather(-1, next_action)[..., 0]
            y = reward + hp["discount"] * (1.0 - terminated) * next_q
        q = self.q(obs).gather(-1, action.long()[..., None])[..., 0]
        loss = torch.nn.functional.huber_loss(q, y, delta=1.0)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.steps += 1
        if self.steps % self.period == 0:
            self.target_q.load_state_dict(self.q.state_dict())
        return {"loss": loss.detach()}


# --- copying JAX parameters in (for equivalence tests) ---------------------------------------------
def _tensor(x, dev: str):
    return torch.as_tensor(np.array(x, np.float32), device=dev)


def load_mlp(module: MLP, flax_mlp: dict[str, Any]) -> None:
    """Copies a flax ``MLP`` param dict (``Dense_i: {kernel [in, out], bias}``) into an ``MLP``."""
    dev = next(module.parameters()).device
    with torch.no_grad():
        for i, layer in enumerate(module.layers):
            dense = flax_mlp[f"Dense_{i}"]
            layer.weight.copy_(_tensor(dense["kernel"], dev).T)
            layer.bias.copy_(_tensor(dense["bias"], dev))


def load_twin_critic(module: TwinCritic, flax_params: dict[str, Any]) -> None:
    load_mlp(module.q1, flax_params["params"]["q1"])
    load_mlp(module.q2, flax_params["params"]["q2"])


def load_td3_from_jax(member: TorchTD3, state) -> None:
    """Copies a single-member ``TD3State``'s networks and targets into ``member`` (fresh optimizers)."""
    load_mlp(member.actor, state.actor["params"]["MLP_0"])
    load_mlp(member.target_actor, state.target_actor["params"]["MLP_0"])
    load_twin_critic(member.critic, state.critic)
    load_twin_critic(member.target_critic, state.target_critic)
    member.steps = int(state.steps)


def load_sac_from_jax(member: TorchSAC, state) -> None:
    load_mlp(member.actor, state.actor["params"]["MLP_0"])
    load_twin_critic(member.critic, state.critic)
    load_twin_critic(member.target_critic, state.target_critic)
    with torch.no_grad():
        member.log_alpha.copy_(_tensor(state.log_alpha, member.dev))
    member.steps = int(state.steps)


def load_dqn_from_jax(member: TorchDQN, state) -> None:
    def load(module: NatureQNetwork, params):
        p = params["params"]
        with torch.no_grad():
            for i, conv in enumerate(module.convs):
                c = p["NatureTorso_0"][f"Conv_{i}"]
                conv.weight.copy_(_tensor(c["kernel"], member.dev).permute(3, 2, 0, 1))  # HWIO -> OIHW
                conv.bias.copy_(_tensor(c["bias"], member.dev))
        load_mlp(module.head, p["MLP_0"])

    load(member.q, state.params)
    load(member.target_q, state.target_params)
    member.steps = int(state.steps)


def batch_to_torch(batch, dev: str, channels_first: bool = False) -> dict[str, Any]:
    """A single-member ``Transition`` (numpy/jax arrays) -> dict of torch tensors on ``dev``.

    ``channels_first`` moves image observations from NHWC (JAX/flax) to NCHW (PyTorch).
    """
    out = {}
    for name in ("obs", "action", "reward", "next_obs", "terminated"):
        x = np.asarray(getattr(batch, name))
        if channels_first and name in ("obs", "next_obs"):
            x = np.ascontiguousarray(np.moveaxis(x, -1, -3))
        tensor = torch.from_numpy(np.array(x))
        out[name] = (
            tensor.to(dev) if tensor.dtype in (torch.uint8, torch.int32, torch.int64) else tensor.float().to(dev)
        )
    return out


def hparams_dict(hparams) -> dict[str, float]:
    """A single-member flax hparams dataclass -> plain Python floats."""
    import dataclasses

    return {f.name: float(np.asarray(getattr(hparams, f.name))) for f in dataclasses.fields(hparams)}
