"""One cell of the study: its schema and profiles, the training loop, evaluation, baseline, provenance."""
