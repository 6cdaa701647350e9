# The DeepSpeed-Ulysses paper's own stack, as its setup section describes it (shared/paper/README.md:
# A100 GPUs, NVSwitch inside a node and InfiniBand between nodes, fp16 mixed precision, activation
# checkpointing, flash attention (causal), DeepSpeed ZeRO-3) with the kernel rates of that era.
# The default profile of `experiments/run SWEEP --scale paper` (profiles/a100.profile includes it);
# `--profile A100-80GB-DGX` prices today's kernels (FlashAttention-2) instead.  Hardware: the DGX A100
# 80 GB node (memory per GPU not stated by the paper: ASSUMED 80 GB).  Nothing here comes from the
# paper's reported results.  Format: docs/MODEL.md.
include = A100-80GB-DGX.profile
name = A100-DGX-paper-stack
precision = fp16                 # the paper: fp16 mixed precision (same bytes as bf16)
# FlashAttention of 2022-23 (v1), the issue's "v1 era": PUBLISHED FlashAttention-2 paper (Dao 2023,
# arXiv:2307.08691): FlashAttention "reaches only 25-40% of the theoretical maximum FLOPs/s" and
# FlashAttention-2 is "around 2x faster": FA2's 0.65 / 0.50 over 1.9 (band: 0.25-0.40)
attn_fwd_eff = 0.35
attn_bwd_eff = 0.27
# FlashAttention v1 parallelises over batch x heads (FA2 paper Sec. 3.2); the tile model here keeps
# 128-row query tiles (sequence-split forward as in FA1's later num_splits / Triton variants): ASSUMPTION.
# Setting attn_tile_rows = 1e9 prices one block per (sequence, head), its worst case.
# DeepSpeed (deepspeed/runtime/zero/config.py, overlap_comm_valid): overlap_comm defaults to true for
# ZeRO stage 3 only; parameters are prefetched (stage3_prefetch_bucket_size); its all-to-alls are
# synchronous (layer communication stays exposed)
overlap_dp_min_stage = 3
# Megatron-DeepSpeed's GPT: fused bias-GELU and bias-dropout-add kernels, no staging copies
fused_kernels = 1
band_attn_scale = 0.71 1.14      # 0.25-0.40 of peak about the 0.35 used
