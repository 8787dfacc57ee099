#!/usr/bin/env bash
# The GPU check of relayrl-vllm and relayrl-deepspeed: one prepared script for one GPU host
# (sized for one H200: about 10 minutes).
#
# Needs, on that host: official vLLM (`pip install vllm`, which brings its CUDA torch), DeepSpeed,
# and relayrl's packages (`pip install -e packages/* plugins/relayrl-vllm plugins/relayrl-deepspeed`).
# Nothing is downloaded: models are built from configs.
#
# What it prints:
#   1. relayrl-vllm's conformance suite (EngineTests on the GPU, kept-sets from vLLM's own sampling
#      masks: logprobs equal the trainer's replay_logprobs), and again on a Qwen3-MoE, where the
#      routing checks run for real (vLLM's routed-experts capture needs Model Runner V2, GPU only).
#   2. tokens/s of plain vLLM vs relayrl's engine (kept-set capture, logprobs, versions) on a ~0.5B
#      model, for both kept-set routes, and the weight-update pause of an in-place update.
#   3. a few DeepSpeed ZeRO-3 bf16 trainer steps on the same size, and a full weight publish.
#   4. the kernel grader on CUDA: the PyTorch kernel tasks' references against themselves and the
#      hand-written faster candidates, graded in the `process` sandbox on the GPU. The sandbox user
#      must be able to run this host's python3 (not one under /root).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/relayrl-gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
status=0

echo "== host"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, vllm, deepspeed; print('torch', torch.__version__, 'vllm', vllm.__version__, 'deepspeed', deepspeed.__version__)" \
    || { echo "vLLM and DeepSpeed must be installed on this host (see the header)"; exit 2; }

echo "== 1. EngineTests on vLLM (GPU)"
timeout 600 python3 -m pytest -q -p no:cacheprovider plugins/relayrl-vllm/tests 2>&1 | tee "$OUT/engine_tests.log" | tail -5 \
    || status=1

echo "== 2. vLLM throughput with and without kept-set capture; weight-update pause (~0.5B, bf16)"
for route in sampling-mask logits-processor; do
    timeout 600 python3 benchmarks/vllm_engine.py --hidden 1024 --layers 24 --vocab 32000 --dtype bfloat16 \
        --batch 64 --prompt 256 --tokens 256 --max-kept 256 --kept-sets "$route" 2>&1 \
        | tee "$OUT/vllm_$route.log" | grep -v " INFO \| WARNING " | tail -8 || status=1
done

echo "== 3. DeepSpeed ZeRO-3 bf16 trainer steps and a full publish (~0.5B)"
timeout 600 torchrun --nproc_per_node=1 benchmarks/gpu/deepspeed_steps.py --hidden 1024 --layers 24 --vocab 32000 \
    --zero-stage 3 --steps 4 2>&1 | tee "$OUT/deepspeed.log" | grep -v "\[INFO\]\|\[WARNING\]" | tail -8 || status=1

echo "== 4. the kernel grader, PyTorch tasks on CUDA"
timeout 300 python3 benchmarks/kernel_grader.py --framework torch --device cuda --python "$(command -v python3)" \
    --backend process --repeats 2 --rounds 5 2>&1 | tee "$OUT/kernel_grader_cuda.log" | tail -12 || status=1

echo "== done (status $status); logs in $OUT"
exit $status
