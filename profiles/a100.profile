# Alias used by the runner's sweeps (experiments/sweeps/*.sweep: profile = a100): the paper's own
# stack on DGX A100 80 GB nodes (A100-DGX-paper-stack.profile: DeepSpeed ZeRO-3, FlashAttention of
# the v1 era, fp16).  `experiments/run SWEEP --scale paper --profile A100-80GB-DGX` prices today's
# kernels instead.  Format: docs/MODEL.md.
include = A100-DGX-paper-stack.profile
