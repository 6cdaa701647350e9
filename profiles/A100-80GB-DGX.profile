# NVIDIA DGX A100 node, 8 x A100-SXM4-80GB — hardware profile for spbench-model (format: docs/MODEL.md).
# Peak rates and bandwidths from NVIDIA's published specifications (cited per
# line); efficiencies are ASSUMPTIONS labelled with the published numbers they
# rest on.  Nothing here is taken from the DeepSpeed-Ulysses paper's results.
name = A100-80GB-DGX
device = gpu
precision = bf16                 # the paper's runs: fp16 mixed precision (same bytes)
ranks_per_node = 8               # DGX A100 datasheet: 8 x A100 per node, NVSwitch
memory = 80GiB                      # A100 datasheet: 80 GB HBM2e
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
mem_bw = 1.63e12                   # A100 datasheet: 2,039 GB/s HBM2e x 0.8 ASSUMED achievable
# communication: time = alpha + bytes / bw, topology in docs/MODEL.md
intra_bw = 240e9                 # A100 datasheet: NVLink 600 GB/s (both directions) = 300 GB/s per direction x 0.8 ASSUMED NCCL efficiency
intra_alpha = 10e-6              # ASSUMPTION: NCCL small-message latency inside a node (order of nccl-tests figures)
inter_bw = 22.5e9                 # DGX A100 datasheet: 8 x 200 Gb/s HDR InfiniBand (one per GPU) = 25 GB/s x 0.9 ASSUMED
inter_alpha = 25e-6              # ASSUMPTION: NCCL small-message latency across InfiniBand
