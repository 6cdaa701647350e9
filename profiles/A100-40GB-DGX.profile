# NVIDIA DGX A100 node, 8 x A100-SXM4-40GB — hardware profile for spbench-model (format: docs/MODEL.md).
# Peak rates and bandwidths from NVIDIA's published specifications (cited per
# line); efficiencies are ASSUMPTIONS labelled with the published numbers they
# rest on.  Nothing here is taken from the DeepSpeed-Ulysses paper's results.
name = A100-40GB-DGX
device = gpu
precision = bf16                 # the paper's runs: fp16 mixed precision (same bytes)
ranks_per_node = 8               # DGX A100 datasheet: 8 x A100 per node, NVSwitch
memory = 40GiB                      # A100 datasheet: 40 GB HBM2
memory_reserved = 4GiB           # ASSUMPTION: CUDA context, framework, allocator fragmentation, transient buffers
# matrix products: rate = gemm_peak * gemm_eff * prod_d d/(d + gemm_half), d = rows, in, out
gemm_peak = 312e12                   # A100 datasheet: BF16/FP16 Tensor Core 312 TFLOPS (dense)
gemm_eff = 0.80                    # ASSUMPTION: typical cuBLAS efficiency on large bf16 GEMMs (~250 TFLOPS of 312; NVIDIA Deep Learning Performance Guide, Matrix Multiplication Background)
gemm_half = 128                  # ASSUMPTION: tile quantisation ramp (128-wide CTA tiles)
# attention (flash): rate = attn_peak * eff * len/(len + attn_half_len), counted FLOPs (causal pairs only)
attn_peak = 312e12
attn_fwd_eff = 0.65             # PUBLISHED: FlashAttention-2 paper (Dao 2023): 50-73% of A100 peak for forward+backward, hdim 128
attn_bwd_eff = 0.50
attn_half_len = 1024             # ASSUMPTION: ramp of the published rate-vs-length curves (PUBLISHED: FlashAttention-2 paper (Dao 2023): 50-73% of A100 peak for forward+backward, hdim 128)
# attention tiles (the tile model, docs/MODEL.md): a call with few heads x query tiles leaves SMs idle
sms = 108                        # A100 datasheet: 108 SMs
attn_tile_rows = 128             # FlashAttention-2's forward at head dim 128: 128 query rows a block
attn_blocks_per_sm = 1           # ASSUMPTION: one such block per SM (its shared memory and registers at head dim 128)
sparse_eff_ratio = 0.5           # ASSUMPTION: blocked-sparse kernels at half the dense kernel's rate per computed FLOP
# element-wise kernels: bytes moved / mem_bw
mem_bw = 1.24e12                   # A100 datasheet: 1,555 GB/s HBM2 x 0.8 ASSUMED achievable
# communication: time = alpha + bytes / bw, topology in docs/MODEL.md
intra_bw = 240e9                 # A100 datasheet: NVLink 600 GB/s (both directions) = 300 GB/s per direction x 0.8 ASSUMED NCCL efficiency
intra_alpha = 10e-6              # ASSUMPTION: NCCL small-message latency inside a node (order of nccl-tests figures)
inter_bw = 22.5e9                 # DGX A100 datasheet: 8 x 200 Gb/s HDR InfiniBand (one per GPU) = 25 GB/s x 0.9 ASSUMED
inter_alpha = 25e-6              # ASSUMPTION: NCCL small-message latency across InfiniBand
# ---- software profiles of the attention kernel (docs/MODEL.md, "Published layouts and software profiles")
# attn_backend = NAME fwd_eff bwd_eff, fractions of attn_peak; --attn-backend NAME picks one (default:
# attn_fwd_eff/attn_bwd_eff above = FlashAttention-2).  "unfused" (Megatron-LM's batched products +
# fused softmax through HBM) is built in and needs no line.
attn_backend = fa2 0.65 0.50     # PUBLISHED: FlashAttention-2 paper (Dao 2023, arXiv:2307.08691) abstract and Fig. 4-6: 50-73% of A100 peak, forward highest
attn_backend = fa1 0.35 0.27     # PUBLISHED: same paper: FlashAttention (v1) "reaches only 25-40% of the theoretical maximum" and FA2 is "around 2x faster": FA2's rates / 1.9
attn_backend = triton 0.45 0.33  # PUBLISHED: same paper Sec. 4.1: FA2 is 1.3-1.5x (forward) and up to ~2x (backward) faster than FlashAttention in Triton: FA2's / 1.45, / 1.5
softmax_fused_max_len = 4096     # PUBLISHED (code): Megatron-LM megatron/model/fused_softmax.py is_kernel_available, 16 < sk <= 4096 (2022-01 to 2023-07; <= 2048 before 2021-08): longer keys take PyTorch's eager softmax
# kernel gaps: idle time between dependent kernels on one stream
kernel_gap = 2e-6                # ASSUMPTION: order of the per-kernel launch cost NVIDIA's "Getting Started with CUDA Graphs" blog (2019) measured for short kernels (~2-3 us)
# ---- the calibration's spread (low = slow end, high = fast end): scripts/validate-model-published draws the band from it
band_gemm_eff = 0.70 0.85        # cuBLAS large fp16/bf16 GEMMs on A100: ~220-265 TFLOPS of 312 (NVIDIA Matrix Multiplication Background guide, Fig. 'A100 GEMM performance')
band_attn_scale = 0.80 1.12      # FlashAttention-2 paper's 50-73% range about the 0.65 used (x 0.77-1.12), the same ratio for FA1/Triton
band_mem_bw_frac = 0.90 1.10     # achievable HBM bandwidth 0.72-0.88 of the datasheet (STREAM-like copies on A100)
band_intra_bw = 200e9 260e9      # nccl-tests all_reduce bus bandwidth on 8 x A100 NVSwitch: ~200-235 GB/s large messages
band_inter_bw = 18e9 24e9        # nccl-tests across DGX A100 nodes (8 x HDR): ~150-190 GB/s per node bus bandwidth = 19-24 GB/s per GPU
band_kernel_gap = 4e-6 1e-6
