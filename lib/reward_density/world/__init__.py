"""The mini world: the offline CPU stand-in for MATH, Qwen3 student and teacher, and a Math-Shepherd PRM."""
