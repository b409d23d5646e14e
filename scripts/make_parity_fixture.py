#!/usr/bin/python3
"""Writes tests/fixtures/gpt_parity.h5: a PyTorch run of a tiny GPT for tests/unit/test_parity.cpp.

Regenerate (deterministic: the same torch build on the same CPU type gives a byte-identical
file; other CPUs may differ in the last float32 bits, well inside the test's tolerances):

    scripts/install_deps.sh --with-torch && /usr/bin/python3 scripts/make_parity_fixture.py

Only Debian's /usr/bin/python3 has torch (python3-torch) and h5py; the model is
scripts/torch_gpt.py. Everything is float32 on one CPU thread.

What it records (config: vocab 64, seq_len 16, n_layer 2, n_head 4, n_embd 32, batch 2):
  root attrs   format "ddiloco-parity-fixture", format_version 1, torch_version, seed, the
               model shape (vocab_size, seq_len, n_layer, n_head, n_embd), batch_size, and the
               optimizer settings (lr, warmup_steps, total_steps, min_lr_frac, beta1, beta2,
               eps, weight_decay, grad_clip, steps)
  /params_init/<name>  initial parameters, ParameterLayout::gpt2 names and shapes
  /tokens, /targets    (B,T) int32, one batch
  /logits (B,T,V), /loss (scalar), /grads/<name>   forward + backward of that batch
  /steps/tokens, /steps/targets (S,B,T) int32   a fresh batch per optimizer step
  /steps/loss, /steps/grad_norm (before clipping), /steps/lr   (S,)
  /steps/clipped (S,) int32: 1 where clipping scaled the gradients
  /params_after/<name> parameters after the S AdamW steps
Each step is: lr = LrSchedule.at(s); zero_grad; forward; backward; clip_grad_norm_; AdamW.

The init (init_stats) is larger than GPT-2's, so that attention, GELU and softmax all work
outside their near-linear range, with non-trivial biases and LayerNorm parameters: a kernel
with a wrong scale or constant, or ignoring a bias or a gain, cannot pass.
"""

from __future__ import annotations

import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, GptConfig, LrSchedule, make_adamw, set_lr  # noqa: E402

SEED = 20240611
BATCH = 2
STEPS = 3
PEAK_LR = 1e-2
WARMUP = 1
TOTAL = 3
MIN_LR_FRAC = 0.1
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.1
# The global gradient norms of the three steps are ~6.34, 5.19, 4.49: clipping at 5.5 scales
# step 0 and leaves steps 1 and 2 alone, so both branches of clip_grad_norm are exercised
# (asserted below, and by test_parity.cpp).
GRAD_CLIP = 5.5


def init_stats(name: str) -> tuple[float, float]:
    """(mean, std) of the normal init of one tensor. Larger than GPT-2's init on purpose: with
    std 0.02 every attention row is near uniform, GELU sees |x| < 0.1 where it is almost linear
    and the logits are near zero, so a wrong attention scale or GELU variant would still match.
    These give O(1) attention scores, GELU inputs and logits, and non-trivial biases and
    LayerNorm parameters."""
    if ".ln_" in name or name.startswith("ln_"):
        return (1.0, 0.2) if name.endswith(".weight") else (0.0, 0.1)
    if name.endswith(".bias"):
        return 0.0, 0.1
    return 0.0, {"wte": 0.3, "wpe": 0.3, "attn.c_attn.weight": 0.3, "attn.c_proj.weight": 0.15,
                 "mlp.c_fc.weight": 0.3, "mlp.c_proj.weight": 0.1}[name.split(".", 2)[-1]]


OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "gpt_parity.h5")


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    config = GptConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, n_embd=32)
    B, T, V = BATCH, config.seq_len, config.vocab_size

    model = GPT(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            mean, std = init_stats(name)
            p.normal_(mean, std, generator=gen)
    params_init = {n: p.detach().clone() for n, p in model.state_dict().items()}

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tok = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
        tgt = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
        return tok, tgt

    # Check the init reaches the non-linear range (hooks on the first block).
    stats = {}
    blk = model.h[0]
    hooks = [blk.mlp.c_fc.register_forward_hook(lambda m, i, o: stats.__setitem__("gelu_in", o)),
             blk.attn.c_attn.register_forward_hook(lambda m, i, o: stats.__setitem__("qkv", o))]

    # One forward + backward.
    tokens, targets = batch()
    logits, loss = model(tokens, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    for h in hooks:
        h.remove()
    hs = config.n_embd // config.n_head
    q, k, _ = stats["qkv"].detach().split(config.n_embd, dim=2)
    scores = (q[..., :hs] @ k[..., :hs].transpose(-2, -1)) / hs**0.5
    print(f"init: GELU input std {stats['gelu_in'].std().item():.2f}, head-0 attention score "
          f"std {scores.std().item():.2f}, logit std {logits.std().item():.2f}")
    model.zero_grad(set_to_none=True)

    # S optimizer steps on fresh batches.
    schedule = LrSchedule(PEAK_LR, WARMUP, TOTAL, MIN_LR_FRAC)
    opt = make_adamw(model, PEAK_LR, BETAS, EPS, WEIGHT_DECAY)
    s_tokens, s_targets, s_loss, s_norm, s_lr, s_clipped = [], [], [], [], [], []
    for s in range(STEPS):
        lr = schedule.at(s)
        set_lr(opt, lr)
        tok, tgt = batch()
        opt.zero_grad(set_to_none=True)
        _, step_loss = model(tok, tgt)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        s_tokens.append(tok)
        s_targets.append(tgt)
        s_loss.append(step_loss.item())
        s_norm.append(norm.item())
        s_lr.append(lr)
        s_clipped.append(int(GRAD_CLIP / (norm.item() + 1e-6) < 1.0))
    assert any(s_clipped) and not all(s_clipped), \
        f"grad_clip {GRAD_CLIP} should clip some steps but not all (norms {s_norm})"
    params_after = {n: p.detach().clone() for n, p in model.state_dict().items()}

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # Contiguous, unfiltered datasets: ddiloco's readers take contiguous storage or their own
    # Fletcher-32 chunks only (no gzip: src/io/h5.cpp, check_storage; docs/fuzzing.md).
    plain = {"track_times": False}

    def f32(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().numpy().astype(np.float32)

    def i32(t) -> np.ndarray:
        return np.asarray(t, dtype=np.int32)

    tmp = OUT + ".tmp"
    # No timestamps in the object headers: regenerating gives a byte-identical file. Links are
    # kept in creation order (ParameterLayout order for the parameter groups).
    order = h5py.h5p.CRT_ORDER_TRACKED | h5py.h5p.CRT_ORDER_INDEXED
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_obj_track_times(False)
    fcpl.set_link_creation_order(order)

    def group(parent: h5py.Group, name: str) -> h5py.Group:
        gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
        gcpl.set_obj_track_times(False)
        gcpl.set_link_creation_order(order)
        return h5py.Group(h5py.h5g.create(parent.id, name.encode(), gcpl=gcpl))

    with h5py.File(h5py.h5f.create(tmp.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl)) as f:
        a = f.attrs
        # Strings as fixed-length bytes (np.bytes_): ddiloco refuses variable-length string
        # attributes, h5py's default for str (docs/fuzzing.md).
        a["format"] = np.bytes_(b"ddiloco-parity-fixture")
        a["format_version"] = np.int64(1)
        a["torch_version"] = np.bytes_(str(torch.__version__).encode())
        a["generator"] = np.bytes_(b"scripts/make_parity_fixture.py")
        a["seed"] = np.int64(SEED)
        for key in ("vocab_size", "seq_len", "n_layer", "n_head", "n_embd"):
            a[key] = np.int64(getattr(config, key))
        a["batch_size"] = np.int64(B)
        a["steps"] = np.int64(STEPS)
        a["lr"] = float(PEAK_LR)
        a["warmup_steps"] = np.int64(WARMUP)
        a["total_steps"] = np.int64(TOTAL)
        a["min_lr_frac"] = float(MIN_LR_FRAC)
        a["beta1"] = float(BETAS[0])
        a["beta2"] = float(BETAS[1])
        a["eps"] = float(EPS)
        a["weight_decay"] = float(WEIGHT_DECAY)
        a["grad_clip"] = float(GRAD_CLIP)

        g = group(f, "params_init")
        for n, t in params_init.items():
            g.create_dataset(n, data=f32(t), **plain)
        f.create_dataset("tokens", data=i32(tokens), **plain)
        f.create_dataset("targets", data=i32(targets), **plain)
        f.create_dataset("logits", data=f32(logits), **plain)
        f.create_dataset("loss", data=np.float32(loss.item()), track_times=False)
        g = group(f, "grads")
        for n, t in grads.items():
            g.create_dataset(n, data=f32(t), **plain)
        g = group(f, "steps")
        g.create_dataset("tokens", data=i32(torch.stack(s_tokens)), **plain)
        g.create_dataset("targets", data=i32(torch.stack(s_targets)), **plain)
        g.create_dataset("loss", data=np.asarray(s_loss, dtype=np.float32), track_times=False)
        g.create_dataset("grad_norm", data=np.asarray(s_norm, dtype=np.float32), track_times=False)
        g.create_dataset("lr", data=np.asarray(s_lr, dtype=np.float64), track_times=False)
        g.create_dataset("clipped", data=np.asarray(s_clipped, dtype=np.int32), track_times=False)
        g = group(f, "params_after")
        for n, t in params_after.items():
            g.create_dataset(n, data=f32(t), **plain)
    os.replace(tmp, OUT)

    print(f"wrote {os.path.relpath(OUT)} ({os.path.getsize(OUT)} bytes), torch {torch.__version__}")
    print(f"loss {loss.item():.6f}; steps: loss {[round(x, 6) for x in s_loss]}, "
          f"grad_norm {[round(x, 6) for x in s_norm]}, lr {s_lr}, clipped {s_clipped}")


if __name__ == "__main__":
    main()
