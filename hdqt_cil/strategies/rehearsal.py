"""What the rehearsal strategies share: the run's one memory budget (trainer.memory_size) and its check."""


def needs_memory(name: str):
    """A `fits` check (strategies/base.py): the strategy keeps samples, so the memory may not be empty."""

    def fits(cfg, trainer, num_classes: int) -> None:
        if trainer.memory_size < 1:
            raise ValueError(f"trainer.memory_size={trainer.memory_size}: {name} replays stored samples and needs "
                             f"a memory of at least one sample")
    return fits
