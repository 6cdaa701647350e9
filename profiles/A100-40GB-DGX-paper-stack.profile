# The paper's own stack (A100-DGX-paper-stack.profile) on DGX A100 40 GB nodes: the same software
# (DeepSpeed ZeRO-3, FlashAttention of the v1 era, fp16), the 40 GB part's memory and HBM.
include = A100-DGX-paper-stack.profile
name = A100-40GB-DGX-paper-stack
memory = 40GiB                   # A100 datasheet: 40 GB HBM2
mem_bw = 1.24e12                 # A100 datasheet: 1,555 GB/s HBM2 x 0.8 ASSUMED achievable
