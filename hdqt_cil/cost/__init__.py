"""Operation counts and energy estimates of training runs on integer hardware (docs/cost.md)."""
