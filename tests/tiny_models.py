"""The tests' stand-ins, now living in the library (reward_density.stand_ins)."""
from reward_density.stand_ins import build_qwen3, build_tokenizer  # noqa: F401
