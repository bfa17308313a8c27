"""Reward density vs LoRA rank: the library behind the study's notebooks."""
