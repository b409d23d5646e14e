#!/usr/bin/env bash
# Regenerates the fuzz targets' seed corpora, fuzz/corpus/<target>/ (docs/fuzzing.md): small
# files of each format, made by the release binary with a tiny configuration (n_layer 1,
# n_embd 8), from configs/, and (wire formats, hello) by hand after the formats' specs. Each
# file ≤ 64 KiB. Needs the release build's binary (scripts/build.sh release ddiloco), h5repack
# (hdf5-tools) and python3-h5py.
#   scripts/fuzz_seeds.sh [path/to/ddiloco]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
ddiloco=$(realpath "${1:-build/ddiloco}")
[[ -x $ddiloco ]] || { echo "fuzz_seeds.sh: no $ddiloco (scripts/build.sh release ddiloco)" >&2; exit 1; }
source scripts/mpi_env.sh
out=$root/fuzz/corpus
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# Token shards: prepare-data on three small documents (one held out: the val shard), and the
# empty shard.
for i in 1 2 3; do
  for j in $(seq 1 40); do echo "Line $j of document $i: the quick brown fox."; done > "doc$i.txt"
done
"$ddiloco" prepare-data --source files --out text --val-fraction 0.34 doc1.txt doc2.txt doc3.txt >/dev/null
rm -rf "$out/shard" && mkdir -p "$out/shard"
cp text/val_000000.bin "$out/shard/val.bin"
/usr/bin/python3 - "$out/shard/empty.bin" <<'PY'
import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, *([0] * 254)))
PY

# A tiny diloco run (2 units of 1 rank): its model.h5, its effective config.yaml and one
# checkpoint. HDF5 seeds: the model file as written (chunked, Fletcher-32), the syncer's file
# repacked contiguous (h5repack -l CONTI: the same objects, 46 KiB instead of 126), and a lost
# unit's file (the unit's header, /outer and /data, no parameters) made from unit_0.h5.
cat > tiny.yaml <<'YAML'
mode: diloco
run: {dir: run, log_every: 10, progress: false, threads: 1}
model: {n_layer: 1, n_head: 2, n_embd: 8, seq_len: 8}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 2, steps: 8, warmup_steps: 2}
eval: {val_tokens: 64, sample_tokens: 0}
units: {count: 2, ranks: [1, 1]}
outer: {h: 4}
syncer: {eval_every: 100000}
checkpoint: {every: 4, keep: 1}
YAML
ddiloco_mpirun -np 3 "$ddiloco" train --config tiny.yaml > train.log 2>&1 || { cat train.log; exit 1; }
ckpt=run/checkpoints/ckpt_00000001
rm -rf "$out/h5_readers" && mkdir -p "$out/h5_readers"
cp run/model.h5 "$out/h5_readers/model.h5"
h5repack -l CONTI "$ckpt/syncer.h5" "$out/h5_readers/syncer.h5"
/usr/bin/python3 - "$ckpt/unit_0.h5" "$out/h5_readers/unit_lost.h5" <<'PY'
import h5py, sys
src, dst = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "w")
for k, v in src.attrs.items():
    dst.attrs[k] = v
dst.attrs["lost"] = 1
for g in ("model", "outer", "data"):
    src.copy(g, dst)
PY

# Configurations: configs/*.yaml and the tiny run's effective config.
rm -rf "$out/config" && mkdir -p "$out/config"
cp "$root"/configs/*.yaml "$out/config/"
cp run/config.yaml "$out/config/effective.yaml"

# Fault schedules: configs/chaos/*.yaml and one drawn by `ddiloco chaos` (4 units).
rm -rf "$out/chaos_schedule" && mkdir -p "$out/chaos_schedule"
cp "$root"/configs/chaos/*.yaml "$out/chaos_schedule/"
"$ddiloco" chaos --config tiny.yaml --set mode=decoupled --set units.count=4 --set units.ranks=[2,2,2,2] \
  --set chaos.horizon_s=600 --set chaos.crash_mtbf_s=300 --set chaos.slow_mtbf_s=200 \
  --set chaos.link_mtbf_s=200 --out "$out/chaos_schedule/drawn.yaml" >/dev/null

# Hello: the handshake of tests/unit/test_membership.cpp's hello_for (unit 1 of 3).
rm -rf "$out/hello" && mkdir -p "$out/hello"
cat > "$out/hello/hello.json" <<'JSON'
{"unit":1,"ranks":2,"model":{"n_layer":4,"n_head":4,"n_embd":128,"vocab_size":256,"seq_len":128},"config_digest":"0123456789abcdef","run_id":"run-a","proof":"5d41402abc4b2a76b9719d911017c592","restart":0,"host":"node7","pid":4242,"window_bytes":1000,"processes":[{"rank":0,"host":"node7","pid":4242},{"rank":1,"host":"node7","pid":4243}]}
JSON

# Wire formats: fuzz/wire_format.cpp's 8-byte header (format, n, block/chunk, topk,
# value_bits) and n = 16 values encoded after wire_format.hpp.
rm -rf "$out/wire_format" && mkdir -p "$out/wire_format"
/usr/bin/python3 - "$out/wire_format" <<'PY'
import struct, sys, math
out = sys.argv[1]
xs = [math.sin(i) * (i % 5) for i in range(16)]
def header(fmt, n, block, topk, bits_sel):
    return struct.pack("<BHHHB", fmt, n, block - 1, topk - 1, bits_sel)
def blocks(q, block, qmax, per_byte):
    scales, codes = [], []
    for b in range(0, len(xs), block):
        blk = xs[b:b + block]
        a = max(abs(x) for x in blk)
        scales.append(a)
        codes += [0 if a == 0 else round(x / a * qmax) for x in blk]
    body = struct.pack(f"<{len(scales)}f", *scales)
    if per_byte == 1:
        return body + bytes((c + 256) % 256 for c in codes)
    width = 8 // per_byte
    packed = bytearray()
    for i in range(0, len(codes), per_byte):
        byte = 0
        for j, c in enumerate(codes[i:i + per_byte]):
            byte |= (c + qmax + (1 if qmax == 7 else 0)) << (j * width)
        packed.append(byte)
    return body + bytes(packed)
seeds = {
    "fp32": header(0, 16, 64, 64, 0) + struct.pack("<16f", *xs),
    "bf16": header(1, 16, 64, 64, 0) + b"".join(struct.pack("<f", x)[2:] for x in xs),
    "int8": header(2, 16, 4, 64, 0) + blocks(xs, 4, 127, 1),
    "int4": header(3, 16, 4, 64, 0) + blocks(xs, 4, 7, 2),
    "int2": header(4, 16, 4, 64, 0) + blocks(xs, 4, 1, 4),
}
# sparse, chunk 16, topk 4, 2-bit values: lo = hi = 1, indices 0..3 (4 bits each), codes 1
# (positive, level 1 = hi).
bits = []
for i in range(4): bits += [(i >> k) & 1 for k in range(4)]
for _ in range(4): bits += [1, 0]
payload = bytearray((len(bits) + 7) // 8)
for i, b in enumerate(bits): payload[i // 8] |= b << (i % 8)
seeds["sparse"] = header(5, 16, 16, 4, 0) + struct.pack("<2f", 1.0, 1.0) + bytes(payload)
for name, data in seeds.items():
    open(f"{out}/{name}.bin", "wb").write(data)
PY

cd "$root"
du -ab fuzz/corpus | sort -k2
