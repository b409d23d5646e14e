#!/usr/bin/env bash
# The paper's claim in one command: ddp and decoupled side by side on the reference
# configuration (configs/paper_regime.yaml), each at its best setting of one sweep
# (docs/results.md, "The paper's claim"), with the two ratios that make the claim — final
# validation loss ÷ ddp's and ddp's bytes per token ÷ decoupled's (both directions, every unit).
# Installs what is missing, builds, prepares data/kjv, then runs both (about 4 minutes on 2 cores).
#   scripts/paper_claim.sh [--set key=value ...]      (e.g. --set run.seed=1338)
# Writes runs/paper_claim_demo/summary.md, summary.json and loss.png.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh release
if [[ ! -f data/kjv/train_000000.bin || ! -f data/kjv/val_000000.bin ]]; then
  build/ddiloco prepare-data --source kjv --out data/kjv
fi
source scripts/mpi_env.sh
# ddp at its own best of the sweep: batch 8 per unit at the same token budget (twice the
# steps), inner lr 4e-3, bf16 on the wire (ddp all-reduces gradients: no int4).
ddp="ddp:wan.format=bf16;train.batch_size=8;train.steps=8000;train.warmup_steps=200;train.lr=4e-3"
exec /usr/bin/python3 scripts/compare_modes.py --config configs/paper_regime.yaml \
  --modes "$ddp,decoupled" --out runs/paper_claim_demo "$@"
