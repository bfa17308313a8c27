"""Running the study: the matrix of cells here (process pool) or on Slurm (submitit), notebooks, the CLI."""
