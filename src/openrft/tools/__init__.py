"""Tool calls: parsing them from model output, and the environments that answer them (multi-turn rollouts)."""
