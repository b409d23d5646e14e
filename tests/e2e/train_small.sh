# The whole path on real text: prepare-data (user files and the KJV), a 2-rank data-parallel
# training run, its JSON-lines metrics, the saved model, eval and sample.
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"

# User text files: documents are files; one is held out.
for i in 1 2 3 4; do
  for j in $(seq 1 200); do echo "Line $j of document $i: the quick brown fox jumps over the lazy dog."; done > "doc$i.txt"
done
"$DDILOCO" prepare-data --source files --out text --val-fraction 0.25 doc1.txt doc2.txt doc3.txt doc4.txt | tee prep.log
grep -q "held out: doc3.txt" prep.log || fail "expected doc3.txt held out"
[[ -f text/train_000000.bin && -f text/val_000000.bin && -f text/manifest.json ]] || fail "shards missing"

# The KJV from Debian's bible-kjv: 66 books, three held out.
"$DDILOCO" prepare-data --source kjv --out kjv | tee kjv.log
grep -q "66 documents" kjv.log || fail "KJV should have 66 books"
grep -q "held out: 2Ki, Nahum, Titus" kjv.log || fail "unexpected KJV validation books"

cat > tiny.yaml <<'YAML'
run: {dir: run, log_every: 5}
model: {n_layer: 2, n_head: 2, n_embd: 32, seq_len: 32}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 4, steps: 30, lr: 3.0e-3, warmup_steps: 5}
eval: {every_steps: 10, val_tokens: 2048, sample_every_steps: 15, sample_tokens: 40, sample_prompt: "Line"}
YAML
ddiloco_mpirun -np 2 "$DDILOCO" train --config tiny.yaml > train.log 2>&1 || { cat train.log; fail "training failed"; }
[[ -f run/config.yaml && -f run/metrics.jsonl && -f run/model.h5 ]] || fail "run outputs missing"
/usr/bin/python3 - run/metrics.jsonl <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
kinds = [e["event"] for e in events]
for k in ("start", "train", "val", "sample", "done"):
    assert k in kinds, f"no {k} event"
for e in events:
    for f in ("event", "step", "tokens", "elapsed_s"):
        assert f in e, f"{e['event']} lacks {f}"
train = [e for e in events if e["event"] == "train"]
assert all("train_loss" in e and "tokens_per_s" in e for e in train)
assert train[-1]["step"] == 30 and train[-1]["tokens"] == 30 * 2 * 4 * 32, train[-1]
vals = [e["val_loss"] for e in events if e["event"] == "val"]
assert len(vals) == 3, vals
assert vals[-1] < vals[0] < 5.6, f"validation loss did not fall: {vals}"
print("metrics ok:", vals)
PY
# A second run into the same directory is refused unless --overwrite, and the refusal leaves
# the first run's files as they were.
before=$(md5sum run/metrics.jsonl run/model.h5 run/config.yaml)
out=$("$DDILOCO" train --config tiny.yaml 2>&1) && fail "training over a finished run was accepted"
[[ $out == *"already holds a run"*"--overwrite"* ]] || fail "unexpected refusal: $out"
[[ $(md5sum run/metrics.jsonl run/model.h5 run/config.yaml) == "$before" ]] || fail "the refused run changed the old one"
# Bad data is found before anything is written, even with --overwrite.
cp text/train_000000.bin bad.bin
printf '\x2c\x01' | dd of=bad.bin bs=1 seek=2000 conv=notrunc status=none   # token 300
out=$("$DDILOCO" train --config tiny.yaml --overwrite --set data.train=bad.bin 2>&1) && fail "bad shard accepted"
[[ $out == *"bad.bin: token 300"* ]] || fail "unexpected error: $out"
[[ $(md5sum run/metrics.jsonl run/model.h5 run/config.yaml) == "$before" ]] || fail "bad data damaged the old run"

# The effective config reads back and trains the same model shape.
"$DDILOCO" config --config run/config.yaml > readback.yaml  # (grep -q in a pipe could SIGPIPE it)
grep -q "n_embd: 32" readback.yaml || fail "config.yaml does not read back"

final=$(json_field run/metrics.jsonl done val_loss)
eval_out=$("$DDILOCO" eval --model run/model.h5)  # reads run/config.yaml
echo "$eval_out"
evaluated=$(echo "$eval_out" | sed -n 's/^val_loss=//p')
/usr/bin/python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); assert abs(a-b) < 1e-4, (a,b)" "$final" "$evaluated" \
  || fail "eval gives $evaluated, training logged $final"
sample=$("$DDILOCO" sample --model run/model.h5 --prompt "Line" --tokens 60 --seed 3)
[[ $sample == Line* ]] || fail "sample does not continue the prompt: $sample"
[[ $("$DDILOCO" sample --model run/model.h5 --prompt "Line" --tokens 60 --seed 3) == "$sample" ]] || fail "sampling with a seed is not reproducible"
echo "train_small: all passed"
