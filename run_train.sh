#!/usr/bin/env bash
# Launch training like TorchTitan:
#   NGPU=4 CONFIG_FILE=train_configs/llama3_debugmodel.toml ./run_train.sh --training.steps 10
# NGPU: processes on this node (default: visible GPUs, or 2 CPU processes without a GPU).
# CONFIG_FILE: job config (default train_configs/llama3_debugmodel.toml).
# Multi-node: NNODES, NODE_RANK, RDZV_ENDPOINT (host:port of node 0) and RDZV_ID
# use torchrun's c10d rendezvous. Extra arguments go to the trainer as
# --section.field overrides.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python}
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi

if [ -z "${NGPU:-}" ]; then
  NGPU=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  [ "$NGPU" -gt 0 ] || NGPU=2
fi
CONFIG_FILE=${CONFIG_FILE:-train_configs/llama3_debugmodel.toml}
NNODES=${NNODES:-1}

if [ "$NNODES" -gt 1 ]; then
  : "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port of node 0 for a multi-node launch}"
  LAUNCH=(--nnodes "$NNODES" --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d
          --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "${RDZV_ID:-torchtitan}")
else
  LAUNCH=(--standalone --nnodes 1)
fi

# One intra-op thread per process on CPU unless the user chose otherwise:
# NGPU processes already share the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The wrapper prints a failure of any rank once and exits 2 for bad input, 1 for a crash.
exec "$PYTHON" -m torchtitan.runtime.launcher "${LAUNCH[@]}" --nproc-per-node "$NGPU" \
  --local-ranks-filter "${LOG_RANK:-0}" --role rank --tee 3 \
  -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@"
