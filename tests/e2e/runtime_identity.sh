# decoupled with one unit, K = 1, P = 1, H = 1, η = 1, μ = 0, overwrite and τ = 0 is plain
# training: the syncer's final Θ must equal the single-unit run's parameters bit for bit; so is
# diloco with H = 5 over five rounds (the outer step's sign, anchor and application, and AdamW's
# state across rounds).
# Streaming with τ = 2 and H = 4 (not decoupled: its learning rates follow the job's tokens as
# the syncer last saw them, which lag a unit that runs ahead), apply: carry (θ ← Θ + θ − θ_sent)
# keeps the two steps made after each snapshot, so it is still plain training up to rounding;
# overwrite drops them and is not. The wire format is fp32: identity is about the outer loop's
# arithmetic (a lossy format rounds what crosses, by design).
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
cd "$WORK"
make_text_shards text
cat > base.yaml <<'YAML'
run: {log_every: 5, progress: false}
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 4, steps: 25, warmup_steps: 5, lr: 3.0e-3}
eval: {every_steps: 0, val_tokens: 1024, sample_tokens: 0}
outer: {fragments: 1, h: 1, overlap: 0, lr: 1.0, momentum: 0.0, apply: overwrite}
syncer: {quorum: 1, eval_every: 10}
wan: {format: fp32}
YAML
"$DDILOCO" train --config base.yaml --set run.dir=plain > plain.log 2>&1 || { cat plain.log; fail "plain run failed"; }
ddiloco_mpirun -np 2 "$DDILOCO" train --config base.yaml --set run.dir=dec --set mode=decoupled \
  > dec.log 2>&1 || { cat dec.log; fail "decoupled run failed"; }
# The same with outer gradients measured from the base version and share-scaled steps (one
# unit: the base is the current Θ and every merge is a whole round, share 1).
ddiloco_mpirun -np 2 "$DDILOCO" train --config base.yaml --set run.dir=dec_base --set mode=decoupled \
  --set outer.anchor=base --set outer.share_steps=true > dec_base.log 2>&1 ||
  { cat dec_base.log; fail "decoupled run with outer.anchor=base failed"; }
# diloco over several rounds of H = 5 inner steps (its own code path: every unit waits for
# every merge, AdamW's state carried across rounds): still plain training bit for bit.
ddiloco_mpirun -np 2 "$DDILOCO" train --config base.yaml --set run.dir=dil --set mode=diloco \
  --set outer.h=5 > dil.log 2>&1 || { cat dil.log; fail "diloco run failed"; }
for run in dec dec_base dil; do
RUN=$run /usr/bin/python3 - <<'PY' || fail "$run: one unit with K = 1, P = 1, η = 1, μ = 0 differs from plain training"
import h5py, json, os, numpy as np
run = os.environ["RUN"]
a, b = h5py.File("plain/model.h5"), h5py.File(f"{run}/model.h5")
names = list(a["params"])
assert names == list(b["params"])
worst = max(float(np.max(np.abs(a["params"][n][...] - b["params"][n][...]))) for n in names)
same = all(np.array_equal(a["params"][n][...], b["params"][n][...]) for n in names)
steps = [json.loads(l) for l in open(f"{run}/unit_0.jsonl")][-1]["step"]
shares = {m["share"] for m in map(json.loads, open(f"{run}/metrics.jsonl")) if m.get("event") == "merge"}
assert shares == {1.0}, shares
merges = sum(1 for m in map(json.loads, open(f"{run}/metrics.jsonl")) if m.get("event") == "merge")
print(f"identity ({run}): {len(names)} tensors, max |Δ| = {worst}, unit steps = {steps}, merges = {merges}")
assert merges == (5 if run == "dil" else 25), merges
assert steps == 25, steps
assert same
PY
done
"$DDILOCO" train --config base.yaml --set run.dir=plain24 --set train.steps=24 > plain24.log 2>&1 ||
  { cat plain24.log; fail "plain 24-step run failed"; }
for apply in carry overwrite; do
  ddiloco_mpirun -np 2 "$DDILOCO" train --config base.yaml --set run.dir=tau_$apply --set mode=streaming \
    --set train.steps=24 --set outer.h=4 --set outer.overlap=2 --set outer.apply=$apply \
    > tau_$apply.log 2>&1 || { cat tau_$apply.log; fail "streaming τ=2 apply=$apply failed"; }
done
/usr/bin/python3 - <<'PY' || fail "apply: carry does not keep the steps made while a merge is in flight"
import h5py, json, numpy as np
def worst(run):
    a, b = h5py.File("plain24/model.h5"), h5py.File(f"{run}/model.h5")
    return max(float(np.max(np.abs(a["params"][n][...] - b["params"][n][...]))) for n in a["params"])
carry, overwrite = worst("tau_carry"), worst("tau_overwrite")
print(f"τ = 2 against plain training: carry max |Δ| = {carry:.2e}, overwrite {overwrite:.2e}")
assert carry < 2e-5, carry
assert overwrite > 100 * carry and overwrite > 1e-4, (carry, overwrite)
# Counters: with carry each snapshot carries the H = 4 steps since the last one; with overwrite
# the counters restart when the merge is applied, τ = 2 steps after the snapshot.
def counted(run):
    return [m["inner_steps"][0] for m in map(json.loads, open(f"{run}/metrics.jsonl"))
            if m["event"] == "merge"]
c, o = counted("tau_carry"), counted("tau_overwrite")
assert len(c) == 6 and set(c) == {4}, c
assert len(o) == 6 and o[0] == 4 and set(o[1:]) == {2}, o
PY
# Post-local SGD: every step of the warm-up is synchronised, applied at once (τ does not
# apply) and merged by a plain average whatever η and μ say. A warm-up over the whole run is
# plain training bit for bit even with streaming's τ = 2, overwrite and Nesterov 0.7 / 0.9
# (fed every step, the momentum would multiply the step by about 7); diloco warmed up for 10
# steps then takes rounds of H = 5 (13 merges) and, plain, is still plain training.
ddiloco_mpirun -np 2 "$DDILOCO" train --config base.yaml --set run.dir=warm --set mode=streaming \
  --set train.steps=24 --set outer.fragments=2 --set outer.h=4 --set outer.overlap=2 \
  --set outer.lr=0.7 --set outer.momentum=0.9 --set outer.warmup_steps=24 > warm.log 2>&1 ||
  { cat warm.log; fail "streaming with a warm-up over the whole run failed"; }
ddiloco_mpirun -np 2 "$DDILOCO" train --config base.yaml --set run.dir=dil_warm --set mode=diloco \
  --set outer.h=5 --set outer.warmup_steps=10 > dil_warm.log 2>&1 ||
  { cat dil_warm.log; fail "diloco with a warm-up failed"; }
/usr/bin/python3 - <<'PY' || fail "outer.warmup_steps: the warm-up is not plain training"
import h5py, json, numpy as np
def same(plain, run):
    a, b = h5py.File(f"{plain}/model.h5"), h5py.File(f"{run}/model.h5")
    return all(np.array_equal(a["params"][n][...], b["params"][n][...]) for n in a["params"])
def merges(run):
    return [m for m in map(json.loads, open(f"{run}/metrics.jsonl")) if m["event"] == "merge"]
w, d = merges("warm"), merges("dil_warm")
print(f"warm-up: streaming {len(w)} merges, diloco {len(d)} "
      f"(at steps {[m['at_steps'][0] for m in d]})")
assert len(w) == 48 and all(m["warm"] for m in w), len(w)
assert [m["at_steps"][0] for m in d] == list(range(1, 11)) + [15, 20, 25], d
assert [m["warm"] for m in d] == [True] * 10 + [False] * 3
assert same("plain24", "warm"), "streaming, whole run warm"
assert same("plain", "dil_warm"), "diloco, warm-up then H = 5"
PY
echo "runtime_identity: passed"
