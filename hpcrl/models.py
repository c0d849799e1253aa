"""Networks, and the flat-parameter view that the MPI windows move around.

:class:`FlatParameters` puts every parameter (and every gradient) of a module into one
contiguous float32 buffer, so pushing a gradient or publishing weights is one buffer, no
copies. :class:`ActorCritic` is the PPO/IMPACT network: separate policy and value networks,
each an MLP (``model.torso: mlp``) or Stellaris' Atari CNN followed by the MLP head
(``model.torso: cnn``, :class:`AtariCNN`). uint8 observations (Atari frames) travel as uint8
and are scaled to [0, 1] by the networks' first layer (:class:`ScaleUint8`).

Box actions: the policy is a diagonal Gaussian and ``act`` returns the raw, unclipped sample
and its log-prob; the actor (env side) clips or rescales it into the action space before
stepping, and stores the unclipped sample for training.
"""
from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn
from torch.nn import functional as F
from torch.distributions import Categorical, Distribution, Normal

from hpcrl.errors import ConfigError
from hpcrl.inference import NumpyActorCritic


class FlatParameters:
    """One contiguous float32 buffer behind all of ``module``'s parameters, and one behind their grads.

    After construction each ``param.data`` is a view into :attr:`params` and each ``param.grad``
    a view into :attr:`grads` (zero copy). Move the module to its device *before* wrapping it:
    ``module.to(...)`` afterwards would give the parameters new storage. Clear gradients with
    :meth:`zero_grad` (``module.zero_grad()`` sets them to None, which detaches them from the buffer).
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self._plist = [p for p in module.parameters()]
        if not self._plist:
            raise ValueError("FlatParameters: module has no parameters")
        device = self._plist[0].device
        if any(p.device != device for p in self._plist):
            raise ValueError("FlatParameters: parameters live on several devices")
        self.num_params = sum(p.numel() for p in self._plist)
        self.params = torch.empty(self.num_params, dtype=torch.float32, device=device)
        self.grads = torch.zeros(self.num_params, dtype=torch.float32, device=device)
        self._views: list[tuple[Tensor, Tensor]] = []
        offset = 0
        for p in self._plist:
            n = p.numel()
            pview = self.params[offset:offset + n].view_as(p)
            gview = self.grads[offset:offset + n].view_as(p)
            pview.copy_(p.data)
            p.data = pview
            p.grad = gview
            self._views.append((pview, gview))
            offset += n

    def slice_of(self, param: Tensor) -> slice:
        """Where ``param`` (one of the module's parameters) lies in :attr:`params` and :attr:`grads`."""
        start = param.data.storage_offset() - self.params.storage_offset()
        return slice(start, start + param.numel())

    def untrained_slices(self) -> list[slice]:
        """Where the values no optimizer steps lie (``requires_grad`` False: PPO's KL coefficient)."""
        return [self.slice_of(p) for p in self._plist if not p.requires_grad]

    def zero_grad(self) -> None:
        """Zero the gradient buffer and (re)attach every ``param.grad`` to its view."""
        self.grads.zero_()
        for p, (_, gview) in zip(self._plist, self._views):
            if p.grad is not gview:  # the same tensor object while attached (cheaper than data_ptr, once per gradient)
                p.grad = gview

    def grads_attached(self) -> bool:
        """True when every ``param.grad`` is still its view into :attr:`grads`."""
        return all(p.grad is g or (p.grad is not None and p.grad.data_ptr() == g.data_ptr())
                   for p, (_, g) in zip(self._plist, self._views))

    def load_(self, flat: Tensor | np.ndarray) -> None:
        """Copy a flat float32 vector of length ``num_params`` into the parameters."""
        src = torch.as_tensor(flat)
        if src.numel() != self.num_params:
            raise ValueError(f"load_: expected {self.num_params} values, got {src.numel()}")
        with torch.no_grad():
            self.params.copy_(src.reshape(-1))

    def numpy(self) -> np.ndarray:
        """The parameter buffer as a numpy array sharing memory (CPU only)."""
        return self.params.detach().numpy()

    def grads_numpy(self) -> np.ndarray:
        """The gradient buffer as a numpy array sharing memory (CPU only)."""
        return self.grads.detach().numpy()


_ACTIVATIONS = {"tanh": (nn.Tanh, torch.tanh), "relu": (nn.ReLU, torch.relu)}


class MLP(nn.Sequential):
    """Linear layers with an activation between them, called as functions: the same modules and
    parameter names as the nn.Sequential it is, without a module call per layer (at an actor's
    batch of 8 the five calls of a 2 x 64 MLP cost a third of its forward)."""

    def __init__(self, *layers: nn.Module, activation: str = "tanh") -> None:
        super().__init__(*layers)
        self._activation = _ACTIVATIONS[activation][1]

    def forward(self, x: Tensor) -> Tensor:
        for layer in self._modules.values():
            x = F.linear(x, layer.weight, layer.bias) if type(layer) is nn.Linear else self._activation(x)
        return x


def _mlp(sizes: list[int], activation: str, out_gain: float) -> MLP:
    """Linear layers with orthogonal init (gain sqrt(2) hidden, out_gain last) and zero biases, as CleanRL."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        lin = nn.Linear(sizes[i], sizes[i + 1])
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(_ACTIVATIONS[activation][0]())
    return MLP(*layers, activation=activation)


_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def normal_log_prob(loc: Tensor, scale: Tensor, value: Tensor) -> Tensor:
    """``Normal(loc, scale).log_prob(value)`` by the same operations in the same order (the same bits and the same
    autograd graph), without building the distribution object (its checks and broadcasts cost more than the
    arithmetic at an actor's batch of 1). ``loc``, ``scale`` and ``value`` have one shape."""
    return -((value - loc) ** 2) / (2 * scale ** 2) - scale.log() - _LOG_SQRT_2PI


def mlp_layers(net: nn.Module) -> tuple[tuple[tuple[Tensor, Tensor], ...], Any] | None:
    """((weight, bias) of each linear layer, activation) of a network that is one :class:`MLP` and nothing else
    (what :func:`run_mlp` evaluates without module calls), else None (uint8 scaling, a CNN torso)."""
    mods = list(net) if isinstance(net, nn.Sequential) and type(net) is not MLP else [net]
    if len(mods) != 1 or type(mods[0]) is not MLP:
        return None
    layers = list(mods[0])
    linears = layers[0::2]
    if any(type(m) is not nn.Linear for m in linears) or any(type(m) is nn.Linear for m in layers[1::2]):
        return None
    return tuple((m.weight, m.bias) for m in linears), mods[0]._activation


def run_mlp(layers: tuple[tuple[Tensor, Tensor], ...], activation, x: Tensor) -> Tensor:
    """:meth:`MLP.forward` on the layers :func:`mlp_layers` took out of it: the same calls in the same order."""
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        x = F.linear(x, w, b)
        if i < last:
            x = activation(x)
    return x


def _inverse_cdf_draw(log_probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One action per row of log pi(.|s) [B, n], as [B, 1]: the first action whose cumulative
    probability exceeds a uniform draw on [0, total) (half the cost of torch.multinomial at an
    actor's batch). Drawing below the row's own total keeps rounding from picking past the last
    action, and an action of probability 0 is never drawn."""
    cdf = log_probs.exp().cumsum(-1)
    u = torch.rand(log_probs.shape[:-1] + (1,), device=log_probs.device, generator=generator) * cdf[..., -1:]
    return (cdf <= u).sum(-1, keepdim=True)


class ScaleUint8(nn.Module):
    """uint8 pixels -> float32 in [0, 1] (the first layer of a network on uint8 observations)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.to(torch.float32).mul_(1.0 / 255.0) if x.dtype == torch.uint8 else x.to(torch.float32)


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) zero padding that gives ceil(size / stride) outputs ('same', as TensorFlow/RLlib)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class AtariCNN(nn.Module):
    """Stellaris Table II's Atari torso: conv 16 8x8 /4, conv 32 4x4 /2 ('same' padding), conv 256 11x11
    (valid), ReLU after each; on 84x84 frames the last layer sees 11x11 and gives 256 features
    (RLlib's default filters for 84x84 inputs, which the Stellaris artifact trains with).

    Input [B, C, H, W] (C = stacked frames); ``features`` is the flattened output width.
    """

    LAYERS = ((16, 8, 4, True), (32, 4, 2, True), (256, 11, 1, False))  # (channels, kernel, stride, same)

    def __init__(self, obs_shape: tuple[int, ...]):
        super().__init__()
        if len(obs_shape) != 3:
            raise ConfigError(f"model.torso: cnn needs image observations [channels, height, width]; the env gives "
                              f"shape {obs_shape}; use torso: mlp")
        channels, h, w = obs_shape
        layers: list[nn.Module] = []
        for out, k, stride, same in self.LAYERS:
            if same:
                (top, bottom), (left, right) = _same_padding(h, k, stride), _same_padding(w, k, stride)
                layers.append(nn.ZeroPad2d((left, right, top, bottom)))
                h, w = -(-h // stride), -(-w // stride)
            else:
                if h < k or w < k:
                    raise ConfigError(f"model.torso: cnn: frames of {obs_shape[1]}x{obs_shape[2]} are too small for "
                                      f"the {k}x{k} layer (Stellaris Table II expects 84x84)")
                h, w = (h - k) // stride + 1, (w - k) // stride + 1
            conv = nn.Conv2d(channels, out, k, stride)
            nn.init.xavier_uniform_(conv.weight)  # as RLlib's SlimConv2d (cheap: no QR of the 256 x 3872 kernel)
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU()]
            channels = out
        self.net = nn.Sequential(*layers, nn.Flatten())
        self.features = channels * h * w

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def network(obs_space: spaces.Box, model_cfg: Any, out: int, out_gain: float) -> nn.Sequential:
    """One network of an actor-critic: [uint8 scaling], [CNN torso], MLP (model.hidden_sizes) to ``out``."""
    layers: list[nn.Module] = []
    if obs_space.dtype == np.uint8:
        layers.append(ScaleUint8())
    width = int(np.prod(obs_space.shape))
    if getattr(model_cfg, "torso", "mlp") == "cnn":
        torso = AtariCNN(tuple(obs_space.shape))
        layers.append(torso)
        width = torso.features
    layers.append(_mlp([width, *model_cfg.hidden_sizes, out], model_cfg.activation, out_gain))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate MLP policy and value networks; Categorical for Discrete, diagonal Gaussian for Box.

    ``flat`` is the :class:`FlatParameters` view of all parameters (policy, value, log-std).
    ``constants`` are named scalars that are not trained (``requires_grad=False``) but travel
    with the weights in ``flat``, e.g. PPO's adaptive KL coefficient set by the parameter rank.
    With ``target_policy`` the model also holds an untrained copy of the policy (``target_pi``,
    and ``target_log_std`` for Box), e.g. IMPACT's target network: :meth:`target_dist` evaluates
    it and :meth:`sync_target_` copies the policy into it; it travels in ``flat`` too.
    """

    def __init__(self, obs_space: spaces.Space, action_space: spaces.Space, model_cfg: Any,
                 device: str | torch.device = "cpu", constants: dict[str, float] | None = None,
                 target_policy: bool = False) -> None:
        super().__init__()
        if not isinstance(obs_space, spaces.Box):
            raise ConfigError(f"env: observation space {obs_space} is not supported; allowed: Box")
        self.sampling_generator: torch.Generator | None = None
        """Where :meth:`act` draws its actions from: an actor's own stream (runtime/roles/actor.py), so the draws
        do not depend on what other threads of the process draw meanwhile; None: torch's global generator."""
        self.obs_shape = tuple(obs_space.shape)
        self.image = getattr(model_cfg, "torso", "mlp") == "cnn"
        if isinstance(action_space, spaces.Discrete):
            self.discrete = True
            self.action_shape: tuple[int, ...] = ()
            out = int(action_space.n)
        elif isinstance(action_space, spaces.Box):
            self.discrete = False
            self.action_shape = tuple(action_space.shape)
            out = int(np.prod(self.action_shape))
        else:
            raise ConfigError(f"env: action space {action_space} is not supported; allowed: Discrete, Box")
        self.pi = network(obs_space, model_cfg, out, out_gain=0.01)
        self.vf = network(obs_space, model_cfg, 1, out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.zeros(out))
        self.has_target = target_policy
        if target_policy:
            self.target_pi = copy.deepcopy(self.pi).requires_grad_(False)
            if not self.discrete:
                self.target_log_std = nn.Parameter(self.log_std.detach().clone(), requires_grad=False)
        if not self.discrete:
            # the action box, for whoever steps the env (buffers: they move with the module, never trained)
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))
        self.constants = nn.ParameterDict({k: nn.Parameter(torch.tensor(float(v)), requires_grad=False)
                                           for k, v in (constants or {}).items()})
        self.to(device)
        self.device = torch.device(device)
        self.flat = FlatParameters(self)
        # the policy's and value's layers for the actor's fast path (a tuple: not registered as submodules, so
        # parameters(), state_dict() and checkpoints are as before); None for a CNN or uint8 network
        self._fast = (mlp_layers(self.pi), mlp_layers(self.vf)) if not self.image else (None, None)
        self._numpy = NumpyActorCritic.of(self)  # the actor's policy call in numpy (None: act converted)

    def _obs(self, obs: Tensor | np.ndarray) -> Tensor:
        """Observations on the model's device: uint8 kept (the network scales it), anything else float32;
        flattened per sample for an MLP, [B, C, H, W] for the CNN."""
        if type(obs) is np.ndarray and obs.dtype == np.float32 and obs.ndim == 2 and len(self.obs_shape) == 1 \
                and self.device.type == "cpu" and obs.flags.writeable:
            return torch.from_numpy(obs)  # an actor's observations [N, obs_dim]: as as_tensor (shared memory), cheaper
        x = torch.as_tensor(obs, device=self.device)
        if x.dtype != torch.uint8:
            x = x.to(torch.float32)
        if self.image:
            return x.reshape((-1, *self.obs_shape))
        return x.reshape(x.shape[:x.dim() - len(self.obs_shape)] + (-1,))

    def _pi_out(self, x: Tensor) -> Tensor:
        """``self.pi(x)``: for an MLP its layers called directly (:func:`run_mlp`, the same operations)."""
        fast = self._fast[0]
        return self.pi(x) if fast is None else run_mlp(fast[0], fast[1], x)

    def _vf_out(self, x: Tensor) -> Tensor:
        """``self.vf(x)``, as :meth:`_pi_out`."""
        fast = self._fast[1]
        return self.vf(x) if fast is None else run_mlp(fast[0], fast[1], x)

    def _dist(self, net: nn.Module, log_std: Tensor | None, obs: Tensor | np.ndarray) -> Distribution:
        out = net(self._obs(obs))
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Normal(out, log_std.exp().expand_as(out), validate_args=False)

    def dist(self, obs: Tensor | np.ndarray) -> Distribution:
        """The action distribution at a batch of observations [B, *obs_shape]."""
        return self._dist(self.pi, None if self.discrete else self.log_std, obs)

    def target_dist(self, obs: Tensor | np.ndarray) -> Distribution:
        """The target policy's action distribution (``target_policy=True`` only), no gradients."""
        with torch.no_grad():
            return self._dist(self.target_pi, None if self.discrete else self.target_log_std, obs)

    def log_prob(self, dist: Distribution, actions: Tensor | np.ndarray) -> Tensor:
        """log dist(a) [B] for a batch of actions (summed over Box dimensions)."""
        return self._logp(dist, torch.as_tensor(actions, device=self.device))

    @torch.no_grad()
    def sync_target_(self) -> None:
        """target <- policy (copies inside the flat buffer)."""
        for t, p in zip(self.target_pi.parameters(), self.pi.parameters()):
            t.copy_(p)
        if not self.discrete:
            self.target_log_std.copy_(self.log_std)

    def value(self, obs: Tensor | np.ndarray) -> Tensor:
        """V(obs), shape [B]."""
        return self._vf_out(self._obs(obs)).squeeze(-1)

    def _logp(self, dist: Distribution, actions: Tensor) -> Tensor:
        if self.discrete:
            return dist.log_prob(actions.long())
        flat = actions.reshape(actions.shape[:actions.dim() - len(self.action_shape)] + (-1,))
        return dist.log_prob(flat.to(torch.float32)).sum(-1)

    def evaluate(self, obs: Tensor | np.ndarray, actions: Tensor | np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
        """(log pi(a|s) [B], entropy [B], V(s) [B]) with gradients. Box: the Normal's log_prob and entropy by
        the same operations, without the distribution object (:func:`normal_log_prob`; the same bits)."""
        x = self._obs(obs)
        actions = torch.as_tensor(actions, device=self.device)
        if self.discrete:
            log_probs = self._log_probs(x)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy, self._vf_out(x).squeeze(-1)
        mean = self._pi_out(x)
        scale = self.log_std.exp().expand_as(mean)
        flat = actions.reshape(actions.shape[:actions.dim() - len(self.action_shape)] + (-1,)).to(torch.float32)
        entropy = 0.5 + 0.5 * math.log(2 * math.pi) + torch.log(scale)  # Normal.entropy
        return normal_log_prob(mean, scale, flat).sum(-1), entropy.sum(-1), self._vf_out(x).squeeze(-1)

    def _log_probs(self, x: Tensor) -> Tensor:
        """Discrete: log pi(.|s) [B, n] at prepared observations, clamped to finite values as
        Categorical's entropy clamps them (0 * log 0 = 0, not NaN). Categorical's own log_prob,
        entropy and sample on the same logits, without building the distribution object (a third
        of an actor's step on small networks)."""
        log_probs = torch.log_softmax(self._pi_out(x), -1)
        return log_probs.clamp(min=torch.finfo(log_probs.dtype).min)

    @torch.no_grad()
    def greedy(self, obs: Tensor | np.ndarray) -> Tensor:
        """The policy's most likely action for a batch: argmax of the logits, or the Gaussian mean."""
        d = self.dist(obs)
        if self.discrete:
            return d.logits.argmax(-1)
        return d.mean.reshape(d.mean.shape[:-1] + self.action_shape)

    @torch.no_grad()
    def act(self, obs: Tensor | np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
        """Sample (action, log-prob, value) for a batch; Box actions are unclipped samples.

        The actor's path, once per env step: the networks' layers called directly and the Normal's sample and
        log_prob by their own operations, no module calls and no distribution object (a third of the cost at
        batch 1). The same operations in the same order as :meth:`act_plain`, so the same draws and the same
        bits (tests/test_models.py compares them)."""
        x = self._obs(obs)
        if self.discrete:
            log_probs = self._log_probs(x)
            a = _inverse_cdf_draw(log_probs, self.sampling_generator)
            return a.squeeze(-1), log_probs.gather(-1, a).squeeze(-1), self._vf_out(x).squeeze(-1)
        mean = self._pi_out(x)
        scale = self.log_std.exp().expand_as(mean)
        if self.sampling_generator is None:
            a = torch.normal(mean, scale)  # Normal.sample
        else:  # Normal.sample's draw (loc + scale * eps), from the actor's own stream
            a = mean + scale * torch.randn(mean.shape, device=mean.device, generator=self.sampling_generator)
        logp = normal_log_prob(mean, scale, a).sum(-1)
        return a.reshape(a.shape[:-1] + self.action_shape), logp, self._vf_out(x).squeeze(-1)

    def act_numpy(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`act` as numpy arrays, what a sampler records: the numpy forward of :mod:`hpcrl.inference` for MLPs
        on the CPU (the same draws, not the same bits: see there), else :meth:`act`'s tensors converted."""
        if self._numpy is not None:
            return self._numpy.act(obs)
        a, logp, v = self.act(obs)
        return a.cpu().numpy(), logp.cpu().numpy(), v.cpu().numpy()

    @torch.no_grad()
    def act_plain(self, obs: Tensor | np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`act` through the modules and torch.distributions (the reference the fast path is tested against)."""
        x = self._obs(obs)
        if self.discrete:
            log_probs = torch.log_softmax(self.pi(x), -1)
            log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
            a = _inverse_cdf_draw(log_probs, self.sampling_generator)
            return a.squeeze(-1), log_probs.gather(-1, a).squeeze(-1), self.vf(x).squeeze(-1)
        d = self.dist(x)
        if self.sampling_generator is None:
            a = d.sample()
        else:
            a = d.loc + d.scale * torch.randn(d.loc.shape, device=d.loc.device, generator=self.sampling_generator)
        logp = self._logp(d, a)
        return a.reshape(a.shape[:-1] + self.action_shape), logp, self.vf(x).squeeze(-1)
