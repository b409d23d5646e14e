#!/usr/bin/python3
"""PyTorch side of `ddiloco bench model`: forward + backward + clip + AdamW tokens/s on CPU.

Same model (scripts/torch_gpt.py mirrors src/model/gpt.cpp), same step and same timing split
as src/cli/bench_model.cpp: random tokens and targets (fixed seed), `--warmup` untimed steps,
then `--steps` timed ones of forward (with the loss), zero_grad + backward, clip_grad_norm_ +
AdamW.step at the constant peak lr (no schedule, as bench model). float32, torch CPU,
torch.set_num_threads(--threads). The last line is `tokens_per_s=<number>`.

    /usr/bin/python3 scripts/bench_torch.py --n-layer 4 --n-embd 128 --seq-len 128 \\
        --batch-size 16 --threads 2 --steps 5

Defaults are ddiloco's (GptConfig, train.*, bench model's --steps/--warmup). Needs Debian's
/usr/bin/python3 with python3-torch (scripts/install_deps.sh --with-torch). Usually run by
scripts/bench_vs_torch.sh, which passes the shape of a ddiloco config.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, GptConfig, make_adamw  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = all cores")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--foreach", action="store_true",
                   help="multi-tensor AdamW (torch's default here is the per-tensor loop)")
    a = p.parse_args()
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be ≥ 1 and --warmup ≥ 0")
    if a.n_embd % a.n_head != 0:
        p.error(f"--n-head {a.n_head} must divide --n-embd {a.n_embd}")

    threads = a.threads if a.threads > 0 else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    torch.manual_seed(a.seed)
    config = GptConfig(a.vocab_size, a.seq_len, a.n_layer, a.n_head, a.n_embd)
    model = GPT(config)
    opt = make_adamw(model, a.lr, (a.beta1, a.beta2), a.eps, a.weight_decay,
                     foreach=True if a.foreach else None)
    B, T = a.batch_size, a.seq_len
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, a.vocab_size, (B, T), generator=gen)
    targets = torch.randint(0, a.vocab_size, (B, T), generator=gen)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"bench torch: n_layer={a.n_layer} n_head={a.n_head} n_embd={a.n_embd} seq_len={T} "
          f"vocab={a.vocab_size} batch={B} params={n_params / 1e6:.2f}M threads={threads} "
          f"steps={a.steps} (+{a.warmup} warm-up) torch={torch.__version__}", flush=True)

    fwd = bwd = upd = 0.0
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        _, loss = model(tokens, targets)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        t3 = time.perf_counter()
        if i >= a.warmup:
            fwd += t1 - t0
            bwd += t2 - t1
            upd += t3 - t2
    total = fwd + bwd + upd
    tps = B * T * a.steps / total
    flops_per_token = 6.0 * n_params + 12.0 * a.n_layer * a.n_embd * T
    ms = 1e3 / a.steps
    print(f"per step: forward {fwd * ms:.1f} ms, backward {bwd * ms:.1f} ms, "
          f"clip+AdamW {upd * ms:.1f} ms, total {total * ms:.1f} ms")
    print(f"achieved {tps * flops_per_token / 1e9:.1f} GFLOP/s (6N+12LCT estimate)")
    print(f"tokens_per_s={tps:.1f}")


if __name__ == "__main__":
    main()
