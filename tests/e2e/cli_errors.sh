# Bad configs and command lines stop with one line naming the key and the expectation.
source "$(dirname "$0")/lib/common.sh"
cd "$WORK"
cat > good.yaml <<'YAML'
model: {n_layer: 1, n_head: 2, n_embd: 16, seq_len: 8}
YAML
cat > unknown.yaml <<'YAML'
train:
  learning_rate: 0.1
YAML
cat > negative_lr.yaml <<'YAML'
train:
  lr: -0.001
YAML
cat > heads.yaml <<'YAML'
model:
  n_embd: 128
  n_head: 5
YAML
printf 'model: [unclosed\n' > broken.yaml

expect_error "unknown.yaml: unknown key 'train.learning_rate'" "$DDILOCO" train --config unknown.yaml
expect_error "negative_lr.yaml: train.lr: must be > 0, got -0.001" "$DDILOCO" train --config negative_lr.yaml
expect_error "heads.yaml: model.n_head: must divide model.n_embd = 128, got 5" "$DDILOCO" train --config heads.yaml
expect_error "broken.yaml: line" "$DDILOCO" config --config broken.yaml
expect_error "--set: train.batch_size: expected an integer, got 'x'" "$DDILOCO" config --config good.yaml --set train.batch_size=x
expect_error "--set: unknown key 'model.n_layers' (did you mean 'model.n_layer'?)" "$DDILOCO" train --config good.yaml --set model.n_layers=2
expect_error "data.train: no token shards match 'nothing/*.bin'" "$DDILOCO" train --config good.yaml --set data.train=nothing/*.bin

# Data files that are not what they claim.
printf "not a shard" > bad.bin; cp bad.bin bad2.bin
expect_error "bad2.bin: file is 11 bytes, shorter than the 1024-byte shard header" "$DDILOCO" train --config good.yaml --set data.train=bad.bin --set data.val=bad2.bin
printf 'caf\xe9\n' > latin1.txt
printf 'fine\n' > ok.txt
expect_error "latin1.txt: invalid UTF-8 at byte 3" "$DDILOCO" prepare-data --source files --out d latin1.txt ok.txt
expect_error "model.h5: not an HDF5 file" bash -c "printf junk > model.h5 && '$DDILOCO' sample --model model.h5"
mkdir adir
: > empty.txt
cp ok.txt copy.txt
expect_error "adir: not a regular file" "$DDILOCO" prepare-data --source files --out d adir ok.txt
expect_error "empty.txt: empty file" "$DDILOCO" prepare-data --source files --out d empty.txt ok.txt
expect_error "ok.txt and copy.txt hold the same text" "$DDILOCO" prepare-data --source files --out d ok.txt copy.txt
expect_error "files given on the command line need --source files" "$DDILOCO" prepare-data --out d ok.txt
[[ ! -e d && ! -e d.partial ]] || fail "a refused prepare-data left files behind"
expect_error "run.dir: 'ok.txt' exists and is not a directory" "$DDILOCO" train --config good.yaml --set run.dir=ok.txt
expect_error "Could not convert: --tokens = 1e3" "$DDILOCO" sample --model model.h5 --tokens 1e3
# Under mpirun, an error every rank sees (a bad key) is reported once, by one rank.
out=$(ddiloco_mpirun -np 3 "$DDILOCO" train --config negative_lr.yaml 2>&1) && fail "mpirun with a bad config exited 0"
[[ $(printf '%s\n' "$out" | grep -c .) == 1 ]] || fail "expected one line from 3 ranks, got: $out"
echo "cli_errors: all passed"
