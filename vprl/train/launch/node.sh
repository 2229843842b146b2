#!/usr/bin/env bash
# One node: the tool service (Ray Serve), trl's vLLM server and the training processes, each on the
# GPUs given, started in that order, each waited for until it answers; everything started here is
# torn down when the training ends, fails or is interrupted, and nothing else: the Ray node is
# stopped through the `ray start --block` process that started it (its processes share its fate),
# never with `ray stop`, which stops every Ray process of the user on the machine.
#
#   TRAIN_GPUS=0,1,2,3 VLLM_GPUS=4,5 TOOL_GPUS=6,7 vprl/train/launch/node.sh configs/X.yaml --global_batch_size 32 [--key value ...]
#
# TRAIN_GPUS  GPUs of the training processes (one process each); empty: one process on the CPU
# VLLM_GPUS   GPUs of `trl vllm-serve`, tensor parallel over them (their count must divide the model's
#             attention heads: 32 for CodeLlama-7B, 16 for CodeGemma-7B); empty: the recipe's own vLLM setting
# TOOL_GPUS   GPUs Ray gives the tool service; SERVE_TOOLS=1 serves the tools without a GPU (tests)
# RAY_PORT, VLLM_PORT, MAIN_PORT   ports (6379, 8000, 29500)
set -euo pipefail

if [[ $# -lt 1 ]]; then
    sed -n '2,14p' "$0" >&2
    exit 2
fi
RECIPE=$1
shift
TRAIN_GPUS=${TRAIN_GPUS-}
VLLM_GPUS=${VLLM_GPUS-}
TOOL_GPUS=${TOOL_GPUS-}
SERVE_TOOLS=${SERVE_TOOLS:-$([[ -n $TOOL_GPUS ]] && echo 1 || echo 0)}
RAY_PORT=${RAY_PORT:-6379}
VLLM_PORT=${VLLM_PORT:-8000}
MAIN_PORT=${MAIN_PORT:-29500}
PYTHON=${PYTHON:-python}
# Ray drains a node it is told to stop (up to 30 s) so that Serve can move replicas elsewhere; this
# service has no elsewhere and no client once the training has ended, so the wait only holds the GPUs.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}
count() {
    if [[ -z $1 ]]; then echo 0; else awk -F, '{print NF}' <<<"$1"; fi
}

overrides=("$@")
ray_pid="" vllm_pid="" ray_log=""
stop() {  # a process this script started, and wait for it
    [[ -n $1 ]] || return 0
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    stop "$vllm_pid"
    stop "$ray_pid"
    [[ -z $ray_log ]] || rm -f "$ray_log"
    exit "$status"
}
trap cleanup EXIT INT TERM

if [[ $SERVE_TOOLS == 1 ]]; then
    overrides+=(--tool_service auto)
fi
if [[ -n $VLLM_GPUS ]]; then
    overrides+=(--use_vllm true --vllm_mode server --vllm_server_host 127.0.0.1 --vllm_server_port "$VLLM_PORT")
fi
# The recipe as vprl/train/rl.py will read it: it fails here, before anything starts, when a key is wrong.
tool_stack="" model_name_or_path=""
eval "$($PYTHON -m vprl.train.recipe tool_stack model_name_or_path -- --config "$RECIPE" "${overrides[@]}")"

run_env=()
if [[ $SERVE_TOOLS == 1 ]]; then
    echo "launch: tool service on GPUs '${TOOL_GPUS}' (Ray on port $RAY_PORT)" >&2
    ray_log=$(mktemp "${TMPDIR:-/tmp}/vprl-ray.XXXXXX")
    CUDA_VISIBLE_DEVICES=$TOOL_GPUS ray start --head --block --port "$RAY_PORT" --num-gpus "$(count "$TOOL_GPUS")" \
        --include-dashboard false --disable-usage-stats >"$ray_log" 2>&1 &
    ray_pid=$!
    # Ready when it says so (what a non-blocking `ray start` waits for). Not `ray status`: it does not
    # pick up ~/.ray/auth_token, which `ray start` does, and is then refused by the node it started.
    deadline=$((SECONDS + 300))
    until grep -q "Ray runtime started" "$ray_log"; do
        kill -0 "$ray_pid" 2>/dev/null || { tail -n 20 "$ray_log" >&2; echo "launch: ray start exited" >&2; exit 1; }
        ((SECONDS < deadline)) || { tail -n 20 "$ray_log" >&2; echo "launch: no Ray node after 300 s" >&2; exit 1; }
        sleep 1
    done
    # `auto` means this cluster, not whichever Ray was started last on the machine
    run_env=(RAY_ADDRESS="127.0.0.1:$RAY_PORT")
    env "${run_env[@]}" "$PYTHON" -m vprl.executor.serve --tool_stack "$tool_stack" --address auto  # returns once every deployment is ready
fi

if [[ -n $VLLM_GPUS ]]; then
    echo "launch: trl vllm-serve on GPUs $VLLM_GPUS (port $VLLM_PORT)" >&2
    # Tensor parallel: trl's vllm-serve refuses data parallel above 1 for a dense model.
    CUDA_VISIBLE_DEVICES=$VLLM_GPUS trl vllm-serve --model "$model_name_or_path" --port "$VLLM_PORT" \
        --tensor_parallel_size "$(count "$VLLM_GPUS")" &
    vllm_pid=$!
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$VLLM_PORT/health/" >/dev/null && break
        kill -0 "$vllm_pid" 2>/dev/null || { echo "launch: the vLLM server exited" >&2; exit 1; }
        sleep 1
    done
    curl -sf "http://127.0.0.1:$VLLM_PORT/health/" >/dev/null || { echo "launch: no vLLM server after 600 s" >&2; exit 1; }
fi

if [[ -z $TRAIN_GPUS ]]; then
    echo "launch: training on the CPU" >&2
    env "${run_env[@]}" "$PYTHON" vprl/train/rl.py --config "$RECIPE" "${overrides[@]}"
else
    n=$(count "$TRAIN_GPUS")
    echo "launch: training on GPUs $TRAIN_GPUS ($n processes)" >&2
    multi=()
    [[ $n -gt 1 ]] && multi=(--multi_gpu)
    env "${run_env[@]}" CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" accelerate launch "${multi[@]}" --num_processes "$n" --num_machines 1 \
        --main_process_port "$MAIN_PORT" vprl/train/rl.py --config "$RECIPE" "${overrides[@]}"
fi
