# Every mode runs to completion on the demo configuration (1 syncer + 4 units on the KJV,
# shortened), writes its global evaluations, merges and final model: model.h5 holds finite
# GPT-2 tensors of the configured shape, its metadata names the run's mode, merges and tokens,
# and `ddiloco eval` of it gives the final global evaluation's loss (it is the final Θ).
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
"$DDILOCO" prepare-data --source kjv --out kjv >/dev/null
for mode in ddp diloco streaming decoupled; do
  start=$SECONDS
  ddiloco_mpirun -np 5 "$DDILOCO" train --config "$SRC/configs/kjv_decoupled.yaml" \
    --set mode=$mode --set run.dir=$mode --set data.train='kjv/train_*.bin' --set data.val='kjv/val_*.bin' \
    --set train.steps=8 --set outer.h=4 --set outer.fragments=2 --set outer.overlap=1 --set outer.warmup_steps=2 \
    --set train.warmup_steps=2 --set eval.val_tokens=2048 --set syncer.eval_every=1 \
    --set run.progress=false > $mode.log 2>&1 || { cat $mode.log; fail "$mode failed"; }
  "$DDILOCO" eval --model $mode/model.h5 > $mode.eval 2>&1 || { cat $mode.eval; fail "$mode: ddiloco eval of model.h5 failed"; }
  /usr/bin/python3 - $mode <<'PY' || fail "$mode outputs"
import h5py, json, math, re, sys
import numpy as np
mode = sys.argv[1]
ev = [json.loads(l) for l in open(f"{mode}/metrics.jsonl")]
kinds = {e["event"] for e in ev}
done = [e for e in ev if e["event"] == "done"][0]
evals = [e for e in ev if e["event"] == "global_eval"]
assert done["mode"] == mode and evals and evals[-1].get("final"), (kinds, done)
for e in evals:
    for k in ("val_loss", "version", "tokens"):
        assert k in e, e
if mode != "ddp":
    merges = [e for e in ev if e["event"] == "merge"]
    assert merges, "no merges"
    for m in merges:
        for k in ("fragment", "version", "units", "weights", "staleness", "quorum_wait_s", "grace_wait_s", "bytes_in", "bytes_out"):
            assert k in m, (k, m)
    if mode in ("diloco", "streaming"):
        assert all(sorted(m["units"]) == [0, 1, 2, 3] for m in merges), "a synchronous merge missed a unit"
assert done["tokens"] >= 4 * 8 * 8 * 128, done  # units × steps × batch × seq_len
with h5py.File(f"{mode}/model.h5", "r") as f:
    meta = json.loads(f.attrs["metadata"])
    assert meta["mode"] == mode and meta["version"] == done["merges"] and meta["tokens"] == done["tokens"], (meta, done)
    params = {k: f["params"][k][()] for k in f["params"]}
# configs/kjv_decoupled.yaml: vocabulary 256, context 128, 4 layers of width 128
assert params["wte"].shape == (256, 128) and params["wpe"].shape == (128, 128), {k: v.shape for k, v in params.items()}
assert sum(k.startswith("h.") and k.endswith(".attn.c_attn.weight") for k in params) == 4, sorted(params)
assert all(np.isfinite(v).all() for v in params.values()), "non-finite parameters"
got = float(re.search(r"val_loss=([0-9.]+)", open(f"{mode}.eval").read()).group(1))
assert math.isclose(got, done["val_loss"], rel_tol=1e-5), (got, done["val_loss"])
print(f"{mode}: {done['tokens']} tokens, {done['merges']} merges, final val_loss {done['val_loss']:.4f}, "
      f"{done['bytes_across_units']/1e6:.1f} MB across units")
PY
  echo "$mode took $((SECONDS - start)) s"
done
echo "runtime_modes: passed"
