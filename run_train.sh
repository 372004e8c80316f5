#!/usr/bin/env bash
# Launch training like TorchTitan:
#   NGPU=4 CONFIG_FILE=train_configs/llama3_debugmodel.toml ./run_train.sh --training.steps 10
# NGPU: processes on this node (default: visible GPUs, or 2 CPU processes without a GPU).
# CONFIG_FILE: job config (default train_configs/llama3_debugmodel.toml).
# TORCHTITAN_DEVICE: auto (default: CUDA when torch sees a GPU), cuda or cpu. Checked
# before any worker starts, with the job config (runtime/preflight.py).
# Multi-node and elastic: NNODES=N or NNODES=MIN:MAX (e.g. 1:4), RDZV_ENDPOINT
# (host:port of the rendezvous host, the same on every node) and optionally
# RDZV_ID (default: slurm-$SLURM_JOB_ID under SLURM, else derived from
# RDZV_ENDPOINT, so every node computes the same one) use torchrun's c10d
# rendezvous. Workers restart on a failure (MAX_RESTARTS failures within any
# RESTART_WINDOW seconds, default 3 per 3600 for such launches, 0 for one node) or
# when a node joins, and resume from the newest complete checkpoint at the new size.
# RDZV_CONF, MONITOR_INTERVAL and SHUTDOWN_TIMEOUT tune the rendezvous (see
# docs/unattended.md). SIGTERM/SIGUSR1/Ctrl-C: the job saves the step in flight and exits
# PREEMPT_EXIT_CODE (default 3); a second signal stops at once with that status.
# Extra arguments go to the trainer as --section.field overrides.
set -euo pipefail
cd "$(dirname "$0")"
# The goodput ledger counts the job's time from here (torchtitan/components/goodput.py).
export TORCHTITAN_LAUNCHED_AT=$(date +%s.%N)

PYTHON=${PYTHON:-python}
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi

if [ -z "${NGPU:-}" ]; then
  NGPU=0
  if [ "${TORCHTITAN_DEVICE:-auto}" != cpu ]; then
    NGPU=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  fi
  [ "$NGPU" -gt 0 ] || NGPU=2
fi
CONFIG_FILE=${CONFIG_FILE:-train_configs/llama3_debugmodel.toml}
NNODES=${NNODES:-1}
MIN_NODES=${NNODES%%:*}
MAX_NODES=${NNODES##*:}
if ! [[ "$MIN_NODES" =~ ^[1-9][0-9]*$ && "$MAX_NODES" =~ ^[1-9][0-9]*$ ]] \
   || [ "$MIN_NODES" -gt "$MAX_NODES" ] || [[ "$NNODES" == *:*:* ]]; then
  echo "error: NNODES=$NNODES: expected a node count N or a range MIN:MAX (e.g. 1:4)" >&2
  exit 2
fi

if [ "$MAX_NODES" -gt 1 ]; then
  if [ -z "${RDZV_ENDPOINT:-}" ]; then
    echo "error: NNODES=$NNODES needs RDZV_ENDPOINT=host:port of the rendezvous host" >&2
    exit 2
  fi
  # One id for every node of this job: the scheduler's job id, else the endpoint's.
  # A requeued SLURM job keeps its id but counts its restarts: etcd keeps a finished
  # rendezvous closed, so each launch needs an id of its own.
  if [ -z "${RDZV_ID:-}" ]; then
    if [ -n "${SLURM_JOB_ID:-}" ]; then
      RDZV_ID="slurm-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"
      # The dump-folder lock knows the job across its requeues by this (dump_lock.py).
      export TORCHTITAN_JOB_ID=${TORCHTITAN_JOB_ID:-slurm-$SLURM_JOB_ID}
    else
      RDZV_ID="tt-$(printf %s "$RDZV_ENDPOINT" | cksum | cut -d' ' -f1)"
    fi
  fi
  # A dead node leaves the rendezvous after keep_alive_interval x keep_alive_max_attempt
  # seconds; the job re-forms last_call_timeout seconds after it has MIN nodes.
  # RDZV_BACKEND=etcd-v2: RDZV_ENDPOINT is an etcd server (started with --enable-v2)
  # holding the rendezvous state, so no node is special; c10d (default): the first
  # node's agent holds it, and losing that node ends the job (exit PREEMPT_EXIT_CODE).
  RDZV_BACKEND=${RDZV_BACKEND:-c10d}
  if [ "$RDZV_BACKEND" != c10d ] && [ "$RDZV_BACKEND" != etcd-v2 ]; then
    echo "error: RDZV_BACKEND=$RDZV_BACKEND: expected c10d or etcd-v2" >&2
    exit 2
  fi
  LAUNCH=(--nnodes "$MIN_NODES:$MAX_NODES" --node-rank "${NODE_RANK:-0}" --rdzv-backend "$RDZV_BACKEND"
          --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RDZV_ID"
          --max-restarts "${MAX_RESTARTS:-3}" --monitor-interval "${MONITOR_INTERVAL:-1}"
          --shutdown-timeout "${SHUTDOWN_TIMEOUT:-15}"
          --rdzv-conf "${RDZV_CONF:-join_timeout=600,last_call_timeout=10,close_timeout=30,heartbeat=5,keep_alive_interval=5,keep_alive_max_attempt=3}")
else
  LAUNCH=(--standalone --nnodes 1 --max-restarts "${MAX_RESTARTS:-0}")
fi

# One intra-op thread per process on CPU unless the user chose otherwise:
# NGPU processes already share the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The restart budget renews: failures older than this many seconds are forgotten.
export TORCHTITAN_RESTART_WINDOW_S=${RESTART_WINDOW:-3600}

# The wrapper prints a failure of any rank once and exits 2 for bad input, 1 for a
# crash, PREEMPT_EXIT_CODE (default 3) after a stop that saved the current step.
# The launcher's own C++ warnings (a TCPStore client of a rendezvous host that died,
# with its stack frames) would bury its one line: errors only there; the workers get
# the user's level back (launcher.py).
export TORCHTITAN_USER_CPP_LOG_LEVEL=${TORCH_CPP_LOG_LEVEL-unset}
TORCH_CPP_LOG_LEVEL=ERROR exec "$PYTHON" -m torchtitan.runtime.launcher "${LAUNCH[@]}" --nproc-per-node "$NGPU" \
  --local-ranks-filter "${LOG_RANK:-0}" --role rank --tee 3 \
  -m torchtitan.train --job.config_file "$CONFIG_FILE" "$@"
