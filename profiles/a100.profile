# Alias used by the runner's sweeps (experiments/sweeps/*.sweep: profile = a100):
# the DGX A100 80 GB node.  Format: docs/MODEL.md.
include = A100-80GB-DGX.profile
