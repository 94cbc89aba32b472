"""What every run adds to its strategy, whatever the strategy (the `trainer` config group's settings are
config.TrainerConfig): the optimizer protocol, the training monitor, the prediction recorder, checkpoints,
CUDA-graph replay, batch augmentation on the device and the quantization plugin."""


def plugin_of(strategy, kind: type):
    """The strategy's plugin of type `kind`, or None where the run has none (CUDA graphs off, no cost counter)."""
    return next((p for p in strategy.plugins if isinstance(p, kind)), None)
