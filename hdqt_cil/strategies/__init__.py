"""Continual-learning strategies, one module each (naive and joint, avalanche's templates as they are, in
base.py), registered with their settings."""
from .base import STRATEGIES, DataFacts, StrategyConfig, build_strategy, check_fits, teachers, training_steps

__all__ = ["STRATEGIES", "DataFacts", "StrategyConfig", "build_strategy", "check_fits", "teachers", "training_steps"]
