"""Tools beside the study: the speed benchmark, the GPU memory estimate, local stand-ins of models and data."""
