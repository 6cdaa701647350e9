# NVIDIA HGX/DGX H100 node, 8 x H100-SXM5-80GB — hardware profile for spbench-model (format: docs/MODEL.md).
# Peak rates and bandwidths from NVIDIA's published specifications (cited per
# line); efficiencies are ASSUMPTIONS labelled with the published numbers they
# rest on.  Nothing here is taken from the DeepSpeed-Ulysses paper's results.
name = H100-80GB-HGX
device = gpu
precision = bf16                 # the paper's runs: fp16 mixed precision (same bytes)
ranks_per_node = 8               # DGX H100 datasheet: 8 x H100 per node, NVSwitch (NVLink 4)
memory = 80GiB                      # H100 datasheet: 80 GB HBM3
memory_reserved = 4GiB           # ASSUMPTION: CUDA context, framework, allocator fragmentation, transient buffers
# matrix products: rate = gemm_peak * gemm_eff * prod_d d/(d + gemm_half), d = rows, in, out
gemm_peak = 989e12                   # H100 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity = 989 dense
gemm_eff = 0.70                    # ASSUMPTION: cuBLAS bf16 large GEMMs ~700 TFLOPS on H100 SXM
gemm_half = 128                  # ASSUMPTION: tile quantisation ramp (128-wide CTA tiles)
# attention (flash): rate = attn_peak * eff * len/(len + attn_half_len), counted FLOPs (causal pairs only)
attn_peak = 989e12
attn_fwd_eff = 0.60             # PUBLISHED: FlashAttention-3 paper (Shah et al. 2024): up to 740 TFLOPS (75%) forward bf16 on H100, backward lower
attn_bwd_eff = 0.45
attn_half_len = 1024             # ASSUMPTION: ramp of the published rate-vs-length curves (PUBLISHED: FlashAttention-3 paper (Shah et al. 2024): up to 740 TFLOPS (75%) forward bf16 on H100, backward lower)
# attention tiles (the tile model, docs/MODEL.md): a call with few heads x query tiles leaves SMs idle
sms = 132                        # H100 SXM5 datasheet: 132 SMs
attn_tile_rows = 128             # FlashAttention-3's forward at head dim 128: 128 query rows a block
attn_blocks_per_sm = 1           # PUBLISHED: FlashAttention-3 (Shah et al. 2024) runs one persistent block per SM
sparse_eff_ratio = 0.5           # ASSUMPTION: blocked-sparse kernels at half the dense kernel's rate per computed FLOP
# element-wise kernels: bytes moved / mem_bw
mem_bw = 2.68e12                   # H100 datasheet: 3.35 TB/s HBM3 x 0.8 ASSUMED
# communication: time = alpha + bytes / bw, topology in docs/MODEL.md
intra_bw = 360e9                 # H100 datasheet: NVLink 900 GB/s (both directions) = 450 GB/s per direction x 0.8 ASSUMED
intra_alpha = 10e-6              # ASSUMPTION: NCCL small-message latency inside a node (order of nccl-tests figures)
inter_bw = 45e9                 # DGX H100 datasheet: 8 x 400 Gb/s ConnectX-7 NDR (one per GPU) = 50 GB/s x 0.9 ASSUMED
inter_alpha = 25e-6              # ASSUMPTION: NCCL small-message latency across InfiniBand
