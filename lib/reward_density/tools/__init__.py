"""Tools beside the study: the speed benchmark against TRL (benchmark), the levers that change the arithmetic
(levers), the paper step on a GPU (paper_benchmark, decode_breakdown), the GPU memory estimate (gpu_memory), their
shared timing helpers (measurement), local stand-ins of models and data (stand_ins), and JupyterLab (lab)."""
