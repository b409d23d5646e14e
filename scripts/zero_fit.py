#!/usr/bin/python3
"""The largest GPT-2 shape (layers at a given width) whose training state fits one device, with
AdamW's state whole or sharded over R ranks (units.zero, include/ddiloco/zero.hpp).

Bytes per rank. The parameter state as the GPU unit allocates it (GptCuda, src/gpu/gpt_cuda.cpp):
fp32 master θ 4·P, its bf16 copy 2·P, fp32 gradients 4·P, the weight-decay mask 1·P, AdamW's m
and v 8·P/R (units.zero = 1 shards only these). Activations as ddiloco's own estimate counts
them (GptConfig::training_bytes, src/model/gpt.cpp), 4·A at the batch: an upper bound on the
GPU, which keeps most of them in bf16. P: GPT-2's parameter count (tied embeddings); A: per
layer 15·N·C + 4·N + B·H·T² (the attention probabilities), plus 12·N·C + N·V (N = B·T).
--device cpu counts the CPU path's state instead: θ and gradients 8·P, AdamW 8·P/R.

    /usr/bin/python3 scripts/zero_fit.py [--device gpu|cpu] [--gib 139] [--batch 16] [--seq 128] [--vocab 50257]
"""
import argparse


def params(V, T, C, L):
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def acts(B, T, C, L, H, V):
    N = B * T
    return L * (N * C * 15 + 4 * N + B * H * T * T) + N * C * 2 + N * V + 10 * N * C


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=139, help="device memory, GiB (an H200: about 139)")
    ap.add_argument("--batch", type=int, default=16, help="train.batch_size (the default: 16)")
    ap.add_argument("--seq", type=int, default=128, help="model.seq_len (the default: 128)")
    ap.add_argument("--vocab", type=int, default=50257, help="model.vocab_size (GPT-2: 50257)")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="whose allocations to count")
    a = ap.parse_args()
    whole = 11 if a.device == "gpu" else 8  # bytes per parameter that every rank holds
    cap = a.gib * 2**30
    ranks = (1, 2, 4, 8)
    print(f"| width C (heads) | " + " | ".join(f"R = {r}: layers, parameters" for r in ranks) + " |")
    print("| --- |" + " --- |" * len(ranks))
    for C, H in ((2048, 16), (4096, 32), (5120, 40), (8192, 64)):
        cells = []
        for R in ranks:
            L = 0
            while True:
                p, act = params(a.vocab, a.seq, C, L + 1), acts(a.batch, a.seq, C, L + 1, H, a.vocab)
                if whole * p + 8 * p / R + 4 * act > cap:
                    break
                L += 1
            cells.append(f"{L}, {params(a.vocab, a.seq, C, L) / 1e9:.1f} B")
        print(f"| {C} ({H}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
