"""What every run adds to its strategy, whatever the strategy (the `trainer` config group's settings are
config.TrainerConfig): the optimizer protocol, the training monitor, the prediction recorder, checkpoints,
CUDA-graph replay, batch augmentation on the device and the quantization plugin."""
