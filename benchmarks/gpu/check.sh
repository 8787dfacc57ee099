#!/usr/bin/env bash
# The GPU check of relayrl-vllm and relayrl-deepspeed: one prepared script for one GPU host
# (sized for one H200: about 15 minutes; the kernel step alone, about 8).
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
#      hand-written faster candidates, graded in the `process` sandbox on the GPU, then the PyTorch
#      grader's tests (every exploit earns 0 and a flag) on the GPU. The sandbox user must be able to
#      run this host's python3 (not one under /root). Needs PyTorch with CUDA and relayrl's
#      relayrl-rollout and relayrl-sandbox, not vLLM or DeepSpeed: without those, steps 1-3 are skipped.
#
# RELAYRL_COMMIT names the commit in the results file where the tree came without its git history;
# the file then says `+unverified` (nothing here can check the copy against that commit).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/relayrl-gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=WARNING
status=0

echo "== host"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if python3 -c "import vllm, deepspeed; print('vllm', vllm.__version__, 'deepspeed', deepspeed.__version__)" 2>/dev/null; then
    engines=1
else
    engines=0
    echo "== 1-3 skipped: vLLM and DeepSpeed are not installed on this host (see the header)"
fi

if [ "$engines" = 1 ]; then
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
fi

echo "== 4. the kernel grader, PyTorch tasks on CUDA"
timeout 420 python3 benchmarks/kernel_grader.py --framework torch --device cuda --python "$(command -v python3)" \
    --backend process --repeats 2 --rounds 5 2>&1 | tee "$OUT/kernel_grader_cuda.log" | tail -12 || status=1
RELAYRL_KERNEL_TORCH_DEVICE=cuda RELAYRL_KERNEL_TORCH_PYTHON="$(command -v python3)" timeout 400 \
    python3 -m pytest -q -p no:cacheprovider packages/environments/tests/test_kernels_torch.py \
    -k "exploit or wrong or against_itself or faster" 2>&1 | tee "$OUT/kernel_tests_cuda.log" | tail -3 || status=1

echo "== done (status $status); logs in $OUT"
exit $status
