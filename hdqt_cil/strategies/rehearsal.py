"""What the rehearsal strategies share: the run's one memory budget (trainer.memory_size) and its checks."""


def needs_memory(name: str):
    """A `fits` check (strategies/base.py): the strategy keeps samples, so the memory may not be empty."""

    def fits(cfg, trainer, num_classes: int) -> None:
        if trainer.memory_size < 1:
            raise ValueError(f"trainer.memory_size={trainer.memory_size}: {name} replays stored samples and needs "
                             f"a memory of at least one sample")
    return fits


def needs_exemplar_per_class(name: str):
    """A `fits` check: the strategy keeps exemplars of every class, so the memory must hold one of each."""

    def fits(cfg, trainer, num_classes: int) -> None:
        if trainer.memory_size < num_classes:
            raise ValueError(f"trainer.memory_size={trainer.memory_size} is smaller than the {num_classes} classes: "
                             f"{name} needs at least one exemplar per class")
    return fits
