"""Each strategy's mechanism against its paper's rule, computed here by hand, on a tiny case: three experiences of
two classes, eight samples of four features a class, a two-layer MLP, SGD with momentum, on the CPU. Each strategy
is built as a run builds it (build_strategy); a Probe plugin reads it at avalanche's events. Where avalanche
departs from the paper, strategies/<name>.py says so, and which departures it mends (LwF and iCaRL's losses:
tests/test_strategies.py)."""
import copy
import random
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from avalanche.benchmarks import nc_benchmark
from avalanche.core import SupervisedPlugin
from avalanche.training.plugins import AGEMPlugin, EvaluationPlugin
from torch import nn
from torch.func import functional_call, grad, vmap

from hdqt_cil.benchmarks.arrays import ArrayDataset
from hdqt_cil.config import TrainerConfig
from hdqt_cil.models import build_model
from hdqt_cil.strategies import STRATEGIES, DataFacts, build_strategy
from hdqt_cil.strategies.er_ace import SumACE
from hdqt_cil.strategies.ewc import EWCPlugin
from hdqt_cil.strategies.si import SIPlugin

N_EXP, PER_CLASS, FEATURES, BATCH = 3, 8, 4, 4
CLASSES = 2 * N_EXP


@pytest.fixture(autouse=True)
def _seeded(one_thread):
    torch.manual_seed(0)
    random.seed(0)


@pytest.fixture(scope="module")
def stream():
    generator = torch.Generator().manual_seed(0)
    y = torch.arange(CLASSES).repeat_interleave(PER_CLASS)
    x = torch.randn(len(y), FEATURES, generator=generator) + torch.randn(CLASSES, FEATURES, generator=generator)[y]
    scenario = nc_benchmark(ArrayDataset(x, y), ArrayDataset(x[::PER_CLASS], y[::PER_CLASS]), n_experiences=N_EXP,
                            task_labels=False, shuffle=False, fixed_class_order=list(range(CLASSES)),
                            class_ids_from_zero_from_first_exp=True)
    return scenario.train_stream


class Probe(SupervisedPlugin):
    """Calls hooks[event](strategy) at each avalanche event named."""

    def __init__(self, **hooks):
        super().__init__()
        for event, hook in hooks.items():
            setattr(self, event, lambda strategy, hook=hook, **kwargs: hook(strategy))


def mlp():
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


def build(name, model, memory=9, before=(), **settings):
    """Strategy `name` with its settings' defaults but `settings`; plugins `before` run ahead of its own."""
    common = dict(optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                  criterion=nn.CrossEntropyLoss(), train_mb_size=BATCH, train_epochs=1, eval_mb_size=BATCH,
                  device="cpu", plugins=list(before), evaluator=EvaluationPlugin(loggers=[]))
    return build_strategy(STRATEGIES.settings(name)(**settings), TrainerConfig(memory_size=memory, batch_size=BATCH),
                          model, common, DataFacts(False, N_EXP))


def params(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def flat(tensors):
    return torch.cat([t.flatten() for t in tensors])


def samples(dataset):
    return torch.stack([s[0] for s in dataset]), torch.tensor([int(s[1]) for s in dataset])


def rows(x):
    return {tuple(r.tolist()) for r in x}


def test_defaults_are_the_papers_settings():
    """Where the papers (or Mammoth's sequential CIFAR-10 runs, for the online forms) give them."""
    settings = {"ewc": {"ewc_lambda": 10.0, "decay": 1.0}, "si": {"c": 0.5, "xi": 1.0},
                "der": {"alpha": 0.1, "beta": 0.5}, "agem": {"sample_size": 256},
                "memo": {"aux_weight": 1.0, "weight_align": True, "train_base": True}}  # MEMO: PyCIL's exps/memo.json
    for name, expected in settings.items():
        cfg = STRATEGIES.settings(name)()
        assert {k: getattr(cfg, k) for k in expected} == expected, name
    assert TrainerConfig().memory_size == 200  # DER++ and ER-ACE's smallest buffer


def test_replay_splits_the_memory_over_experiences_and_doubles_each_batch(stream):
    """Replay: after experience k the memory holds mem_size/(k+1) samples of each experience (the remainder to
    the first), a random subset of it that only shrinks later. Each batch is BATCH new samples and BATCH stored
    ones, drawn in passes over the memory whose last batch holds what is left (10 samples: 4, 4, 2, 4, ...)."""
    batches = []
    strategy = build("replay", mlp(), memory=10)
    strategy.plugins.append(Probe(before_forward=lambda s: batches.append((s.experience.current_experience,
                                                                            s.mb_y.clone()))))
    replay = next(p for p in strategy.plugins if hasattr(p, "storage_policy"))
    groups, sizes = {}, {0: [10], 1: [5, 5], 2: [4, 3, 3]}
    for exp in stream:
        strategy.train(exp)
        kept = {k: rows(samples(g.buffer)[0]) for k, g in replay.storage_policy.buffer_groups.items()}
        assert [len(kept[k]) for k in sorted(kept)] == sizes[exp.current_experience]
        assert kept[exp.current_experience] <= rows(samples(exp.dataset)[0])
        assert all(kept[k] <= groups[k] for k in groups)
        groups = kept
    stored = {k: [(y < 2 * k).sum().item() for j, y in batches if j == k] for k in range(N_EXP)}
    assert stored == {0: [0] * 4, 1: [4, 4, 2, 4], 2: [4, 4, 2, 4]}
    assert all(len(y) - (y < 2 * k).sum() == BATCH for k, y in batches)


def test_der_pp_loss_is_ce_plus_alpha_logit_mse_plus_beta_stored_ce(stream):
    """DER++: CE(new) + α·MSE(h(x'), z') + β·CE(h(x'), y'), z' the logits the model gave x' when stored (at the end
    of its experience, in eval mode); avalanche draws one stored batch for both terms (the paper draws two)."""
    alpha, beta, seen, old = 0.3, 0.7, {"losses": 0}, {}

    def check(s):
        if s.experience.current_experience == 0:
            return
        m, out, y = s.batch_size_mem, s.mb_output, s.mb_y
        assert m == BATCH and torch.allclose(s.batch_logits, old["model"](s.mb_x[:m]))
        expected = (F.cross_entropy(out[m:], y[m:]) + alpha * ((out[:m] - s.batch_logits) ** 2).mean()
                    + beta * F.cross_entropy(out[:m], y[:m]))
        assert torch.allclose(s.loss, expected), (s.loss, expected)
        seen["losses"] += 1

    def keep(s):
        old["model"] = copy.deepcopy(s.model).eval()

    strategy = build("der", mlp(), alpha=alpha, beta=beta)
    strategy.plugins.append(Probe(before_backward=check, after_training_exp=keep))
    for exp in list(stream)[:2]:
        strategy.train(exp)
    assert seen["losses"] == PER_CLASS * 2 // BATCH
    counts = Counter(samples(strategy.storage_policy.buffer)[1].tolist())
    assert counts == {0: 3, 1: 2, 2: 2, 3: 2}  # class-balanced over the classes seen


def test_er_ace_sums_an_asymmetric_incoming_ce_and_a_full_stored_ce(stream):
    """ER-ACE: CE of the incoming batch over the classes present in it + CE of an as large stored batch over every
    output; the paper's sum (avalanche's criterion returns the mean: strategies/er_ace.py)."""
    seen = {"losses": 0}

    def check(s):
        if s.experience.current_experience == 0:
            return
        present = s.mb_y.unique()
        log_p = F.log_softmax(s.mb_output[:, present], dim=1)
        incoming = -log_p[torch.arange(len(s.mb_y)), torch.searchsorted(present, s.mb_y)].mean()
        assert len(s.mb_buffer_y) == BATCH
        expected = incoming + F.cross_entropy(s.mb_buffer_out, s.mb_buffer_y)
        assert torch.allclose(s.loss, expected), (s.loss, expected)
        seen["losses"] += 1

    strategy = build("er_ace", mlp())
    strategy.plugins.append(Probe(before_backward=check))
    for exp in list(stream)[:2]:
        strategy.train(exp)
    assert seen["losses"] == PER_CLASS * 2 // BATCH


def test_er_ace_loss_stays_finite_where_logits_are_far_apart():
    """A target logit 200 below another's: the loss is that gap (log-softmax), its gradient finite; a log of a
    softmax (avalanche's ACE) rounds the target's probability to 0, an infinite loss and a NaN gradient."""
    out_in = torch.tensor([[0.0, 200.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    target_in = torch.tensor([0, 1])
    out_buffer, target_buffer = torch.zeros(2, 3), torch.tensor([2, 0])
    loss = SumACE()(out_in, target_in, out_buffer, target_buffer)
    loss.backward()
    incoming = (200 + torch.log1p(torch.exp(torch.tensor(-200.0))) + torch.log(torch.tensor(2.0))) / 2
    assert torch.allclose(loss, incoming + torch.log(torch.tensor(3.0)))
    assert torch.isfinite(out_in.grad).all()


def test_agem_projects_a_conflicting_gradient_off_the_reference_gradient(stream):
    """A-GEM: g_ref is the gradient of the loss on a sample of the memory (memory_size / #experiences samples of
    each past experience); the applied gradient is g − (gᵀg_ref / g_refᵀg_ref)·g_ref when gᵀg_ref < 0, else g."""
    model, seen = mlp(), {"projected": 0, "kept": 0}

    def raw(s):
        if not agem.buffers:
            return
        x, y = seen["reference_batch"][:2]
        seen["g"] = flat(p.grad for p in s.model.parameters())
        reference = flat(torch.autograd.grad(F.cross_entropy(s.model(x), y), list(s.model.parameters())))
        assert torch.allclose(agem.reference_gradients, reference, atol=1e-7)
        # the whole memory, smaller here than sample_size: all that past experiences left
        assert len(y) == sum(len(b) for b in agem.buffers) and set(y.tolist()) <= set(range(2 * len(agem.buffers)))

    def applied(s):
        if not agem.buffers:
            return
        g, g_ref = seen["g"], agem.reference_gradients
        dot = g @ g_ref
        expected = g - dot / (g_ref @ g_ref) * g_ref if dot < 0 else g
        assert torch.allclose(flat(p.grad for p in s.model.parameters()), expected, atol=1e-7)
        seen["projected" if dot < 0 else "kept"] += 1

    strategy = build("agem", model, memory=12, before=[Probe(after_backward=raw)])
    strategy.plugins.append(Probe(after_backward=applied))
    agem = next(p for p in strategy.plugins if isinstance(p, AGEMPlugin))
    draw = agem.sample_from_memory

    def drawn():
        seen["reference_batch"] = draw()
        return seen["reference_batch"]

    agem.sample_from_memory = drawn
    for exp in stream:
        strategy.train(exp)
        assert [len(b) for b in agem.buffers] == [12 // N_EXP] * (exp.current_experience + 1)
    assert seen["projected"] == 2 * 2 * PER_CLASS // BATCH  # new classes' gradients conflict with the old ones'
    agreeing = agem.reference_gradients + 0.1 * torch.randn_like(agem.reference_gradients)
    sizes = [p.numel() for p in model.parameters()]
    for p, g in zip(model.parameters(), agreeing.split(sizes)):
        p.grad = g.view_as(p).clone()
    seen["g"] = agreeing
    agem.after_backward(strategy)
    applied(strategy)
    assert seen["kept"] == 1


def fisher(model, theta, dataset):
    """Mean over `dataset` of each sample's squared cross-entropy gradient at `theta` (torch.func, per sample)."""
    x, y = samples(dataset)

    def loss(theta, x, y):
        return F.cross_entropy(functional_call(model, theta, (x[None],)), y[None])

    return {k: g.pow(2).mean(0) for k, g in vmap(grad(loss), in_dims=(None, 0, 0))(theta, x, y).items()}


def test_ewc_penalty_is_lambda_times_the_per_sample_fisher_distance(stream):
    """Online EWC: in experience 1 the loss adds λ·Σ F₀ (θ − θ*₀)², F₀ the per-sample empirical Fisher at θ*₀ over
    experience 0's data; afterwards F = γ·F₀ + F₁ and θ* = θ*₁. avalanche's plugin squares mini-batch gradients
    (strategies/ewc.py)."""
    lamb, decay, model = 10.0, 0.5, mlp()
    theta_star, penalties = [], []

    def penalty(s):
        if s.experience.current_experience == 1:
            penalties.append((s.loss - F.cross_entropy(s.mb_output, s.mb_y), params(s.model)))

    strategy = build("ewc", model, ewc_lambda=lamb, decay=decay)
    strategy.plugins.append(Probe(before_backward=penalty, after_training_exp=lambda s: theta_star.append(
        params(s.model))))
    ewc = next(p for p in strategy.plugins if isinstance(p, EWCPlugin))
    experiences = list(stream)[:2]
    for exp in experiences:
        strategy.train(exp)
    f0, f1 = (fisher(model, theta, exp.dataset) for theta, exp in zip(theta_star, experiences))
    for got, theta in penalties:
        expected = lamb * sum((f0[k] * (theta[k] - theta_star[0][k]) ** 2).sum() for k in f0)
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-8), (got, expected)
    assert penalties[-1][0] > 1e-4
    for k in f0:
        assert torch.allclose(ewc.importances[1][k].data, decay * f0[k] + f1[k], rtol=1e-5, atol=1e-9), k
        assert torch.equal(ewc.saved_params[1][k].data, theta_star[1][k])


def test_ewc_makes_no_fisher_pass_after_the_runs_last_experience(stream, monkeypatch):
    passes = []
    original = EWCPlugin.compute_importances
    monkeypatch.setattr(EWCPlugin, "compute_importances", lambda self, *a, **k: passes.append(1) or original(
        self, *a, **k))
    strategy = build("ewc", mlp())
    ewc = next(p for p in strategy.plugins if isinstance(p, EWCPlugin))
    for exp in stream:
        strategy.train(exp)
    assert len(passes) == N_EXP - 1 and sorted(ewc.saved_params) == [N_EXP - 2]


def test_si_importance_is_the_task_loss_path_integral_and_the_penalty_c_times_it(stream):
    """SI: ω = −Σ_steps g·Δθ (g the task loss's gradient, Δθ the step SGD with momentum took), Ω = Σ_experiences
    ω / (Δ² + ξ), and the loss adds c·Σ Ω (θ − θ*)². avalanche's plugin kept views of the weights on the CPU (all
    Δθ zero), clipped Ω at 0.001, halved c and took g from the penalised loss (strategies/si.py)."""
    c, xi, model = 0.5, 1.0, mlp()
    names = [name for name, _ in model.named_parameters()]
    hand = {"omega": 0, "Omega": torch.zeros(sum(p.numel() for p in model.parameters())), "penalties": []}

    def at(s, key):
        hand[key] = flat(s.model.parameters()).detach().clone()

    def task_gradient(s):
        task = F.cross_entropy(s.mb_output, s.mb_y)
        hand["g"] = flat(torch.autograd.grad(task, list(s.model.parameters()), retain_graph=True))
        if s.experience.current_experience > 0:
            theta = flat(s.model.parameters()).detach()
            expected = c * (hand["Omega"] * (theta - hand["star"]) ** 2).sum()
            hand["penalties"].append((s.loss - task, expected))

    def step(s):
        hand["omega"] = hand["omega"] - hand["g"] * (flat(s.model.parameters()).detach() - hand["before"])

    def end(s):
        delta = flat(s.model.parameters()).detach() - hand["start"]
        hand["Omega"] = hand["Omega"] + hand["omega"] / (delta ** 2 + xi)
        hand["omega"] = 0
        at(s, "star")
        got = flat(si.ewc_data[1][name].data for name in names)
        assert torch.allclose(got, hand["Omega"], rtol=1e-4, atol=1e-7), (got - hand["Omega"]).abs().max()

    strategy = build("si", model, c=c, xi=xi)
    strategy.plugins.append(Probe(before_training_exp=lambda s: at(s, "start"),
                                  before_training_iteration=lambda s: at(s, "before"),
                                  before_backward=task_gradient, after_training_iteration=step,
                                  after_training_exp=end))
    si = next(p for p in strategy.plugins if isinstance(p, SIPlugin))
    for exp in list(stream)[:2]:
        strategy.train(exp)
    assert hand["Omega"].max() > 0.01  # important weights stay apart: no clipping
    for got, expected in hand["penalties"]:
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-8), (got, expected)
    assert hand["penalties"][-1][1] > 1e-5


def test_gdumb_retrains_its_initial_model_on_a_class_balanced_memory_alone(stream):
    """GDumb: at each experience the model restarts from its initial weights and trains on the memory only, which
    keeps mem_size / #classes seen samples of each class (the remainder to the first)."""
    model = mlp()
    initial, seen = params(model), []

    def start(s):
        state = params(s.model)
        seen.append(Counter(samples(s.adapted_dataset)[1].tolist()))
        assert all(torch.equal(state[k], initial[k]) for k in initial)
        assert {id(p) for g in s.optimizer.param_groups for p in g["params"]} == {id(p) for p in s.model.parameters()}

    strategy = build("gdumb", model)
    strategy.plugins.append(Probe(before_training_epoch=start, after_training_exp=lambda s: seen.append(
        not torch.equal(params(s.model)["0.weight"], initial["0.weight"]))))
    for exp in stream:
        strategy.train(exp)
    assert seen == [{0: 5, 1: 4}, True, {0: 3, 1: 2, 2: 2, 3: 2}, True, {0: 2, 1: 2, 2: 2, 3: 1, 4: 1, 5: 1}, True]


def test_memo_trains_a_shared_trunk_under_one_branch_per_experience_on_ce_plus_aux_ce(stream):
    """MEMO: features [φ_1(φ_g(x)), φ_2(φ_g(x))] of one generalised block φ_g (the MLP's first hidden layer) and a
    specialised block φ_k (its last) per experience; logits W·features + b; the loss CE(logits, y) + λ·CE(U·φ_2 + u,
    y'), y' = y − |old| + 1 for a new class and 0 for an old one (PyCIL's auxiliary head), CE alone in the first
    experience. By hand from the layers' weights: the logits, the loss, and the gradients, which reach φ_g through
    the frozen φ_1 too (φ_1 itself gets none). After the experience the new classes' rows of W are scaled to the old
    rows' mean norm."""
    aux_weight, seen = 0.5, {"losses": 0, "aux targets": set()}

    def check(s):
        net, x, y = s.model, s.mb_x, s.mb_y
        if s.experience.current_experience == 0:
            assert net.aux_classifier is None and torch.allclose(s.loss, F.cross_entropy(s.mb_output, y))
            return
        trunk, (old, new) = net.features.trunk[1].weight, [e[0].weight for e in net.features.extractors]
        shared = F.relu(x @ trunk.T)
        branches = [F.relu(shared @ w.T) for w in (old, new)]
        logits = torch.cat(branches, dim=1) @ net.classifier.weight.T + net.classifier.bias
        aux = branches[1] @ net.aux_classifier.weight.T + net.aux_classifier.bias
        aux_y = torch.where(y >= 2, y - 2 + 1, 0)
        seen["aux targets"] |= set(aux_y.tolist())
        loss = F.cross_entropy(logits, y) + aux_weight * F.cross_entropy(aux, aux_y)
        assert torch.allclose(s.mb_output, logits) and torch.allclose(s.loss, loss), (s.loss, loss)
        seen["grads"] = torch.autograd.grad(loss, [trunk, new])
        seen["losses"] += 1

    def after_backward(s):
        if s.experience.current_experience == 1:
            trunk, (old, new) = s.model.features.trunk[1].weight, [e[0].weight for e in s.model.features.extractors]
            assert old.grad is None and all(torch.allclose(p.grad, g) for p, g in zip((trunk, new), seen["grads"]))
            assert {id(trunk), id(new)} <= {id(p) for p in s.optimizer.param_groups[0]["params"]}

    strategy = build("memo", build_model("mlp", (FEATURES,), CLASSES), aux_weight=aux_weight)
    strategy.plugins.append(Probe(before_backward=check, after_backward=after_backward))
    for exp in list(stream)[:2]:
        strategy.train(exp)
    assert seen["losses"] == -(-(2 * PER_CLASS + 9) // BATCH)  # the new classes' samples and the memory's 9
    assert seen["aux targets"] == {0, 1, 2}  # "old", then the two new classes
    norms = strategy.model.classifier.weight.norm(dim=1)
    assert torch.allclose(norms[2:].mean(), norms[:2].mean())
