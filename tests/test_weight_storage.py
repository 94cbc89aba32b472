"""trainer.weight_bits: the weights live on a `bits`-bit grid of their own scale between optimizer steps."""
import pytest
import torch
from torch import nn

from hdqt_cil.experiment import run
from hdqt_cil.trainer.weight_storage import WeightStorage, stored_weights


def on_grid(weight: torch.Tensor, bits: int) -> bool:
    """Whether weight = levels · (max|w| / qmax) with integer levels of magnitude at most qmax, qmax reached."""
    qmax = 2 ** (bits - 1) - 1
    scale = weight.abs().max() / qmax
    levels = weight / scale
    return bool(torch.allclose(levels, levels.round(), atol=1e-4) and levels.abs().max().round() == qmax)


class _Strategy:
    def __init__(self, model):
        self.model = model


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_every_update_leaves_the_weights_on_their_grid(bits):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
    storage, strategy = WeightStorage(bits), _Strategy(model)
    storage.before_training_exp(strategy)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 3, 6, 6)).square().mean().backward()
        optimizer.step()
        storage.after_update(strategy)
        assert all(on_grid(w, bits) for w in stored_weights(model))
    assert not on_grid(model[0].bias, bits) and not on_grid(model[1].weight + 0.1, bits)  # biases, norms: float


def test_a_run_with_8_bit_weights_says_so_in_its_cost_and_trains_otherwise(make_cfg, tmp_path):
    cfg = ("strategy=naive", "trainer.epochs=2", "trainer.device=cpu", "benchmark.n_experiences=2")
    plain = run(make_cfg(*cfg), tmp_path / "plain")
    stored = run(make_cfg(*cfg, "trainer.weight_bits=8"), tmp_path / "stored")
    coarse = run(make_cfg(*cfg, "trainer.weight_bits=2"), tmp_path / "coarse")
    assert stored["status"] == coarse["status"] == "complete"
    assert plain["cost"]["weights stored"]["bits"] == 32 and stored["cost"]["weights stored"]["bits"] == 8
    weights = stored["cost"]["weights stored"]["weights"]
    assert weights == plain["cost"]["weights stored"]["weights"] > 0
    assert stored["cost"]["weights stored"]["MiB"] == pytest.approx(weights / 2**20)
    assert stored["train_loss"] != plain["train_loss"] != coarse["train_loss"]


def test_weight_bits_out_of_range_is_refused(make_cfg):
    from hdqt_cil.config import validate

    with pytest.raises(ValueError, match=r"trainer.weight_bits=1 .*null \(float32 weights\) or an integer from 2 "):
        validate(make_cfg("trainer.weight_bits=1"))


def test_the_authors_update_stores_every_trained_parameter_after_a_plain_step(make_cfg):
    """trainer.weight_update=authors: SGD without momentum or weight decay at the base lr all experience long (no
    milestone drop), and every trained parameter, biases and normalisation too, on its own 8-bit grid."""
    from hdqt_cil.config import validate
    from hdqt_cil.trainer.optim import PerExperienceSGD, sgd_settings

    cfg = make_cfg("trainer.weight_bits=8", "trainer.weight_update=authors", "trainer.milestones=[1]")
    validate(cfg)
    momentum, weight_decay, milestones = sgd_settings(cfg.trainer)
    assert (momentum, weight_decay, milestones) == (0.0, 0.0, [])
    assert PerExperienceSGD(0.1, milestones).lr_after(5) == 0.1
    assert sgd_settings(make_cfg("trainer.milestones=[1]").trainer)[2] == [1]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.Linear(8 * 4 * 4, 5))
    storage, strategy = WeightStorage(8, every_parameter=True), _Strategy(model)
    storage.before_training_exp(strategy)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
    for _ in range(2):
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        model(torch.randn(4, 3, 6, 6)).square().mean().backward()
        stepped = [b.add(p.grad, alpha=-0.1) for b, p in zip(before, model.parameters())]
        optimizer.step()
        assert all(torch.equal(p, s) for p, s in zip(model.parameters(), stepped))  # plain w - lr·g
        storage.after_update(strategy)
        assert all(on_grid(p, 8) for p in model.parameters())


def test_the_authors_update_needs_stored_weights(make_cfg):
    from hdqt_cil.config import validate

    with pytest.raises(ValueError, match=r"trainer.weight_update=authors .*set trainer.weight_bits"):
        validate(make_cfg("trainer.weight_update=authors"))


def test_a_run_with_the_authors_update_counts_every_stored_parameter(make_cfg, tmp_path):
    """Their update stores biases and normalisation at 8 bits too: the run's cost counts every trained parameter,
    more than the weights alone, and the run trains."""
    cfg = ("strategy=naive", "trainer.epochs=1", "trainer.device=cpu", "benchmark.n_experiences=2",
           "trainer.weight_bits=8")
    weights = run(make_cfg(*cfg), tmp_path / "weights")["cost"]["weights stored"]["weights"]
    authors = run(make_cfg(*cfg, "trainer.weight_update=authors"), tmp_path / "authors")
    assert authors["status"] == "complete"
    stored = authors["cost"]["weights stored"]
    assert stored["bits"] == 8 and stored["weights"] > weights > 0
