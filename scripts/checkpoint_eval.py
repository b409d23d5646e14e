#!/usr/bin/python3
"""Validation loss of a ddiloco checkpoint (or model file), computed from the HDF5 file alone.

    /usr/bin/python3 scripts/checkpoint_eval.py CHECKPOINT_DIR_OR_H5 [--val 'data/kjv/val_*.bin']
                                                [--val-tokens N]

Reads Θ with h5py (syncer.h5 of a checkpoint, unit_0.h5 of a mode single one: /params/<tensor>,
the same layout as model.h5), the run's configuration from the file's `config` attribute (mode
single: the manifest's `config`; data.val, eval.val_tokens), and the
validation shards (llm.c format: 256 int32 header words, magic 20240520, then uint16 tokens);
then runs GPT-2 forward in NumPy (float64) and prints val_loss=<mean nats/token>. It is an
independent check of the layout documented in docs/checkpoints.md "Checkpoints and resume": the number must
match what `ddiloco eval --model CHECKPOINT` prints.

The model mirrors src/model/ (scripts/torch_gpt.py is the PyTorch twin): pre-LayerNorm blocks
(eps 1e-5), causal attention, GELU tanh approximation, tied output embedding (wte).
The validation set mirrors ValidationSet (src/data/data_loader.cpp): the first
val_tokens // T sequences of T + 1 tokens at stride T of the shards in sorted order.
"""
import argparse
import glob
import json
import math
import os
import sys

import h5py
import numpy as np
import yaml


def check_manifest(directory):
    """The cheap half of `ddiloco inspect`: manifest present, every listed file of its size."""
    manifest = os.path.join(directory, "manifest.json")
    if not os.path.exists(manifest):
        if any(n.startswith("ckpt_") for n in os.listdir(directory)):
            sys.exit(f"{directory}: holds checkpoints (ckpt_<id>): pass one of them")
        sys.exit(f"{directory}: no manifest.json: not a complete checkpoint")
    try:
        files = json.load(open(manifest))["files"]
        for f in files:
            size = os.path.getsize(os.path.join(directory, f["name"]))
            if size != f["bytes"]:
                sys.exit(f"{directory}/{f['name']}: {size} bytes, the manifest records {f['bytes']}")
    except (ValueError, KeyError, TypeError, OSError) as e:
        sys.exit(f"{manifest}: invalid manifest: {e}")


def load(path):
    config = None
    if os.path.isdir(path):
        check_manifest(path)
        with open(os.path.join(path, "manifest.json")) as m:
            manifest = json.load(m)
        if manifest.get("mode") == "single":  # θ of its one unit; the configuration in the manifest
            config = yaml.safe_load(manifest["config"]) if "config" in manifest else None
            path = os.path.join(path, "unit_0.h5")
        else:
            path = os.path.join(path, "syncer.h5")
    f = h5py.File(path, "r")
    model = {k: int(v) for k, v in f["model"].attrs.items()}
    params = {name: np.asarray(ds[()], dtype=np.float64) for name, ds in f["params"].items()}
    if "config" in f.attrs:
        config = yaml.safe_load(f.attrs["config"])
    return model, params, config, path


def val_sequences(pattern, T, val_tokens):
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"no validation shard matches {pattern}")
    want, seqs = max(1, val_tokens // T), []
    for name in files:
        raw = np.fromfile(name, dtype=np.uint8)
        header = raw[:1024].view(np.int32)
        if header[0] != 20240520:
            sys.exit(f"{name}: not an llm.c shard (magic {header[0]})")
        tokens = raw[1024:1024 + 2 * int(header[2])].view(np.uint16).astype(np.int64)
        start = 0
        while start + T + 1 <= len(tokens) and len(seqs) < want:
            seqs.append(tokens[start:start + T + 1])
            start += T
        if len(seqs) >= want:
            break
    return np.stack(seqs)


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def loss(model, p, seqs):
    n_head, L = model["n_head"], model["n_layer"]
    x_tok, y_tok = seqs[:, :-1], seqs[:, 1:]
    B, T = x_tok.shape
    C = p["wte"].shape[1]
    hs = C // n_head
    x = p["wte"][x_tok] + p["wpe"][:T]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(L):
        g = lambda name: p[f"h.{l}.{name}"]
        h = layernorm(x, g("ln_1.weight"), g("ln_1.bias"))
        qkv = h @ g("attn.c_attn.weight").T + g("attn.c_attn.bias")
        q, k, v = (t.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=2))
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs)
        att = np.where(mask, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ g("attn.c_proj.weight").T + g("attn.c_proj.bias")
        h = layernorm(x, g("ln_2.weight"), g("ln_2.bias"))
        h = gelu(h @ g("mlp.c_fc.weight").T + g("mlp.c_fc.bias"))
        x = x + h @ g("mlp.c_proj.weight").T + g("mlp.c_proj.bias")
    x = layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ p["wte"].T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y_tok[..., None], axis=-1).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path", help="checkpoint directory, its syncer.h5, or a model.h5")
    ap.add_argument("--val", help="validation shard glob (default: the file's data.val)")
    ap.add_argument("--val-tokens", type=int, help="default: the file's eval.val_tokens")
    args = ap.parse_args()
    model, params, config, path = load(args.path)
    pattern = args.val or (config or {}).get("data", {}).get("val")
    val_tokens = args.val_tokens or (config or {}).get("eval", {}).get("val_tokens")
    if pattern is None or val_tokens is None:
        sys.exit(f"{path} holds no configuration: pass --val and --val-tokens")
    seqs = val_sequences(pattern, model["seq_len"], int(val_tokens))
    total = 0.0
    for i in range(0, len(seqs), 16):
        chunk = seqs[i:i + 16]
        total += loss(model, params, chunk) * len(chunk)
    print(json.dumps({"file": path, "sequences": len(seqs), "tensors": len(params)}))
    print(f"val_loss={total / len(seqs):.6f}")


if __name__ == "__main__":
    main()
