"""The training monitor's divergence rules on scripted losses: non-finite, runaway (RUNAWAY_FACTOR over the
experience's first epoch, at least over 1), and ordinary ups and downs that are neither; a NaN reaching a quantizer,
put down to where training is."""
from types import SimpleNamespace

import pytest
import torch

from hdqt_cil.quant import preset, quantize_model
from hdqt_cil.trainer.monitor import RUNAWAY_FACTOR, Diverged, TrainingMonitor, quantizer_checks_diverge


def run_epochs(monitor, strategy, epoch_losses):
    for epoch, loss in enumerate(epoch_losses):
        strategy.clock.train_exp_epochs = epoch
        monitor.before_training_epoch(strategy)
        for _ in range(3):
            strategy.loss = torch.tensor([loss])
            monitor.after_training_iteration(strategy)
        monitor.after_training_epoch(strategy)


def fresh(experience=0):
    strategy = SimpleNamespace(device="cpu", model=torch.nn.Linear(2, 2), train_epochs=10, plugins=[],
                               is_training=True, clock=SimpleNamespace(train_exp_counter=experience,
                                                                       train_exp_epochs=0))
    monitor = TrainingMonitor()
    monitor.before_training_exp(strategy)
    return monitor, strategy


def test_a_loss_running_away_by_orders_of_magnitude_is_divergence():
    monitor, strategy = fresh(experience=2)
    with pytest.raises(Diverged, match=r"experience 3, epoch 3: runaway loss 2.4e\+03") as caught:  # counted from 1
        run_epochs(monitor, strategy, [0.06, 0.5, 2.4e3])
    assert caught.value.details == {"experience": 2, "epoch": 3, "where": caught.value.details["where"]}
    assert monitor.losses == [[pytest.approx(0.06), pytest.approx(0.5)]]


@pytest.mark.parametrize("losses", [[2.3, 0.4, 3.0, 900.0], [5000.0, 4000.0, RUNAWAY_FACTOR * 4999.0],
                                    [1e-4, 1e-6, 999.0]])
def test_ups_and_downs_below_the_rule_are_not(losses):
    monitor, strategy = fresh()
    run_epochs(monitor, strategy, losses)
    assert monitor.losses[0] == pytest.approx(losses)


def test_a_non_finite_loss_or_weight_is_divergence_naming_it():
    monitor, strategy = fresh()
    with pytest.raises(Diverged, match="epoch 2: non-finite loss"):
        run_epochs(monitor, strategy, [1.0, float("nan")])
    monitor, strategy = fresh()
    with torch.no_grad():
        strategy.model.weight[0, 0] = float("inf")
    with pytest.raises(Diverged, match="non-finite weights in weight"):
        run_epochs(monitor, strategy, [1.0])


@pytest.mark.parametrize("training, finished_experiences, finished_epochs, place", [
    (True, 1, 1, "experience 2, epoch 2"),  # in an epoch, or at its end before avalanche's clock counts it
    (True, 1, 3, "experience 2, epoch 3"),  # after the experience's 3 epochs: BiC's bias stage, herding
    (False, 2, 3, "experience 2, epoch 3"),  # the evaluation after experience 2
])
def test_a_nan_reaching_a_quantizer_is_a_divergence_where_training_is(training, finished_experiences,
                                                                       finished_epochs, place):
    model = quantize_model(torch.nn.Sequential(torch.nn.Linear(4, 2)), preset("hdqt"))
    strategy = SimpleNamespace(is_training=training, train_epochs=3, plugins=[],
                               clock=SimpleNamespace(train_exp_counter=finished_experiences,
                                                     train_exp_epochs=finished_epochs))
    with pytest.raises(Diverged, match=rf"training diverged in {place}: layer '0': non-finite value nan in the input"):
        with quantizer_checks_diverge(strategy):
            model(torch.tensor([[1.0, float("nan"), 0.0, 2.0]]))
