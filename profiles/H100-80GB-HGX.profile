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
gemm_eff = 0.76                    # MEASURED: median rate / peak of the 48 7B layer products on one H200 (results/gpu/, profiles/H200-141GB-HGX-measured.profile; same GH100 SMs, clocks and 989 TFLOPS as H100 SXM)
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
# ---- software profiles of the attention kernel (docs/MODEL.md, "Published layouts and software profiles")
attn_backend = fa3 0.60 0.45     # PUBLISHED: FlashAttention-3 paper (Shah et al. 2024): up to 740 TFLOPS (75%) forward bf16, backward lower (the default above)
attn_backend = fa2 0.36 0.33     # PUBLISHED: FlashAttention-2 paper (Dao 2023) Fig. 7: up to 335 TFLOPS forward+backward on H100 (34% of 989; no TMA/wgmma)
attn_backend = triton 0.25 0.22  # PUBLISHED: same paper Sec. 4.1: FA2 1.3-1.5x faster than FlashAttention in Triton: FA2's / 1.45, / 1.5
softmax_fused_max_len = 4096     # as A100-80GB-DGX.profile (Megatron-LM fused_softmax.py)
kernel_gap = 2e-6                # ASSUMPTION: as A100-80GB-DGX.profile (NVIDIA CUDA Graphs blog, 2019: ~2-3 us per short kernel)
band_gemm_eff = 0.70 0.87        # MEASURED on one H200 (same GH100 SMs and clocks as H100 SXM; results/gpu/, H200-141GB-HGX-measured.profile): 0.70-0.87 over 48 layer products
band_attn_scale = 0.80 1.12      # as A100: the published ranges about the values used
band_mem_bw_frac = 0.90 1.10
band_intra_bw = 300e9 450e9      # nccl-tests all_reduce bus bandwidth on 8 x H100 NVLink 4: ~350-480 GB/s (NVLS highest)
band_inter_bw = 35e9 48e9        # 8 x 400 Gb/s NDR per node: ~280-380 GB/s bus bandwidth per node
band_kernel_gap = 4e-6 1e-6
