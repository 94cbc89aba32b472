"""Elastic weight consolidation (Kirkpatrick et al., PNAS 2017), online form (Schwarz et al., 2018): a quadratic
penalty λ · Σ F_i (θ_i − θ*_i)² that holds each weight near its value after the last experience, weighted by its
diagonal Fisher information, accumulated over experiences with a decay γ (F ← γF + F_new). The paper writes λ/2:
our λ is Mammoth's (no ½), whose online EWC runs on sequential CIFAR-10 give λ = 10, γ = 1.

F is the empirical Fisher: the mean over the experience's training samples of each sample's squared gradient of
its cross-entropy (true labels, model in eval mode). avalanche's EWCPlugin averages the squares of *mini-batch
mean* gradients instead, which is not the Fisher's diagonal: about 1/batch_size of it once the mean gradient is
small, so that the same λ weakens as the batch grows. We mend that (EWCPlugin.compute_importances below), one
sample a backward pass."""
from dataclasses import dataclass

from avalanche.training.plugins import ewc as avalanche_ewc
from avalanche.training.templates import SupervisedTemplate
from avalanche.training.utils import zerolike_params_dict
from torch.utils.data import DataLoader

from ..settings import NON_NEGATIVE, setting
from .base import STRATEGIES, StrategyConfig


class EWCPlugin(avalanche_ewc.EWCPlugin):
    """`n_experiences`: the run's; the Fisher information of its last experience would weigh no later one, so its
    pass over that experience's samples (one backward each) is not made."""
    n_experiences = None  # what a plugin restored from a checkpoint written before the setting existed holds

    def __init__(self, *args, n_experiences: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.n_experiences = n_experiences

    def after_training_exp(self, strategy, **kwargs):
        if strategy.clock.train_exp_counter + 1 != self.n_experiences:
            super().after_training_exp(strategy, **kwargs)

    def compute_importances(self, model, criterion, optimizer, dataset, device, batch_size, num_workers=0):
        """Per-sample empirical Fisher: mean over the samples of (∂ criterion(model(x), y) / ∂θ)²."""
        model.eval()
        importances = zerolike_params_dict(model)
        loader = DataLoader(dataset, batch_size=batch_size, collate_fn=getattr(dataset, "collate_fn", None),
                            num_workers=num_workers)
        for batch in loader:
            x, y = batch[0].to(device), batch[1].to(device)
            for i in range(len(y)):
                optimizer.zero_grad()
                criterion(model(x[i:i + 1]), y[i:i + 1]).backward()
                for p, imp in zip(model.parameters(), importances.values()):
                    if p.grad is not None:
                        imp.data += p.grad.pow(2)
        for imp in importances.values():
            imp.data /= len(dataset)
        optimizer.zero_grad()
        model.train()
        return importances


@dataclass
class EWCConfig(StrategyConfig):
    name: str = "ewc"
    ewc_lambda: float = setting(10.0, NON_NEGATIVE)  # weight of the penalty
    decay: float = setting(1.0, NON_NEGATIVE)  # γ: the older experiences' Fisher information kept (online mode)


@STRATEGIES.register("ewc", EWCConfig)
def build(cfg, trainer, model, common, data):
    ewc = EWCPlugin(cfg.ewc_lambda, mode="online", decay_factor=cfg.decay, n_experiences=data.n_experiences)
    return SupervisedTemplate(model=model, **{**common, "plugins": [*common["plugins"], ewc]})
