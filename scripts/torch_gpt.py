"""PyTorch reference of ddiloco's GPT-2, AdamW parameter groups and learning-rate schedule.

Imported by scripts/make_parity_fixture.py (writes tests/fixtures/gpt_parity.h5, checked by
tests/unit/test_parity.cpp) and scripts/bench_torch.py (the PyTorch side of
scripts/bench_vs_torch.sh). Needs Debian's /usr/bin/python3 with python3-torch
(scripts/install_deps.sh --with-torch).

Every piece mirrors one C++ file; keep them in step:
  GptConfig, GPT.state_dict() names/order  <-> include/ddiloco/model.hpp, src/model/gpt.cpp
                                               (ParameterLayout::gpt2)
  the layers (LayerNorm eps, GELU, attention, softmax cross-entropy)
                                           <-> include/ddiloco/layers.hpp, src/model/layers.cpp
  adamw_param_groups / make_adamw          <-> src/optim/adamw.cpp (AdamW<S>, TensorView
                                               weight_decay flags)
  LrSchedule                               <-> include/ddiloco/optim.hpp, src/optim/adamw.cpp
  clip_grad_norm_ (torch's own)            <-> clip_grad_norm in src/optim/adamw.cpp
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GptConfig:
    """Model shape; mirrors ddiloco::GptConfig (include/ddiloco/model.hpp), same defaults."""

    vocab_size: int = 256
    seq_len: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128


class CausalSelfAttention(nn.Module):
    """layers::attention_forward with the two Linear layers around it (src/model/layers.cpp).

    c_attn produces q | k | v on the last dim (3C); head h is columns h*hs .. h*hs+hs of each
    third. Causal softmax of q.k^T / sqrt(hs), then P.v with heads concatenated.
    """

    def __init__(self, config: GptConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        mask = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)  # not in state_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    """c_fc (C -> 4C), GELU tanh approximation (layers::gelu_forward), c_proj (4C -> C)."""

    def __init__(self, config: GptConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    """One pre-LayerNorm block, the loop body of Gpt<S>::forward (src/model/gpt.cpp)."""

    def __init__(self, config: GptConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=1e-5)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Gpt<S> (include/ddiloco/model.hpp, src/model/gpt.cpp).

    state_dict() keys and their order are exactly ParameterLayout::gpt2's tensor names:
    wte, wpe, h.{l}.ln_1.weight ... h.{l}.mlp.c_proj.bias, ln_f.weight, ln_f.bias. wte is tied
    with the output projection (logits = ln_f(x) @ wte.T, no bias).
    """

    def __init__(self, config: GptConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Parameter(torch.empty(config.vocab_size, config.n_embd))
        self.wpe = nn.Parameter(torch.empty(config.seq_len, config.n_embd))
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=1e-5)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 init as Gpt<S>::init_weights: N(0, 0.02), the c_proj weights
        N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm gains 1 (a different RNG, so the values
        differ from the C++ ones)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif "ln_" in name:
                p.fill_(1.0)
            else:
                std = residual_std if name.endswith("c_proj.weight") else 0.02
                p.normal_(0.0, std, generator=generator)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None):
        """Returns (logits (B,T,V), mean cross-entropy over B*T or None)."""
        B, T = tokens.shape
        assert T <= self.config.seq_len
        x = self.wte[tokens] + self.wpe[:T]
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.t()
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def decays(name: str) -> bool:
    """TensorView::weight_decay of ParameterLayout::gpt2: the embeddings and the four matmul
    weights per block decay; LayerNorm gains and all biases do not."""
    if name in ("wte", "wpe"):
        return True
    return name.endswith(
        ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    )


def adamw_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The two AdamW groups of src/optim/adamw.cpp: decayed tensors, then the others."""
    params = list(model.named_parameters())
    return [
        {"params": [p for n, p in params if decays(n)], "weight_decay": weight_decay},
        {"params": [p for n, p in params if not decays(n)], "weight_decay": 0.0},
    ]


def make_adamw(
    model: nn.Module,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    foreach: bool | None = False,
) -> torch.optim.AdamW:
    """torch.optim.AdamW equal to ddiloco::AdamW<float> (src/optim/adamw.cpp); the defaults
    are ddiloco's AdamWConfig / train.* defaults. foreach=False: the per-tensor loop (the same
    arithmetic as foreach=True, which batches the tensors; None = torch's default)."""
    return torch.optim.AdamW(
        adamw_param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps, foreach=foreach
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass
class LrSchedule:
    """LrSchedule::at (include/ddiloco/optim.hpp, src/optim/adamw.cpp): linear warm-up
    peak*(step+1)/warmup for step < warmup, then a half cosine down to peak*min_lr_frac at
    total_steps, constant after."""

    peak_lr: float = 1e-3
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_frac: float = 0.1

    def at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        min_lr = self.peak_lr * self.min_lr_frac
        if step >= self.total_steps or self.total_steps <= self.warmup_steps:
            return min_lr
        ratio = (step - self.warmup_steps) / (self.total_steps - self.warmup_steps)
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
        return min_lr + coeff * (self.peak_lr - min_lr)
