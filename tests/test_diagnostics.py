"""diagnostics=light (trainer/diagnostics.py): the copies it compares, the measures, and a run that records them
without changing its numbers."""
import gc
import json
import math
import pickle
import shutil
import warnings
import weakref

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin
from torch import nn

from hdqt_cil import experiment
from hdqt_cil.experiment import run
from hdqt_cil.files import write_json
from hdqt_cil.models import build_model
from hdqt_cil.quant import preset, quantize_model
from hdqt_cil.results.tables import make_tables
from hdqt_cil.quant import QuantSpec
from hdqt_cil.quant.backend import TORCH_OPS
from hdqt_cil.quant.layers import ROLE_CODES, ROLE_STRIDE
from hdqt_cil.quant.rounding import Counter
from hdqt_cil.trainer.diagnostics import (GradientDiagnostics, ModelCopies, QuantizerWatch, _Diagnosis, _Pass,
                                          diagnose_batch, fidelity, float_shadow, quantizer_steps, replayed,
                                          watched)
from hdqt_cil.trainer.landscape import filter_normalised_direction, loss_landscape, slice_summary


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 5))


def test_the_measures_on_hand_made_gradients():
    m = fidelity(torch.tensor([1.0, 0.0, -2.0]), torch.tensor([1.0, 1.0, 0.0]))
    assert m["cosine"] == pytest.approx(1 / math.sqrt(5) / math.sqrt(2))
    assert m["rel_error"] == pytest.approx(math.sqrt(0 + 1 + 4) / math.sqrt(2))
    assert m["sign"] == 0.5  # the reference's zero is not counted; 0 against 1 disagrees
    assert fidelity(torch.ones(3), torch.ones(3)) == {"cosine": pytest.approx(1.0), "rel_error": 0.0, "sign": 1.0}
    assert all(math.isnan(v) for v in fidelity(torch.ones(2), torch.zeros(2)).values())


def test_the_quantized_copy_replays_the_steps_own_gradients_and_the_shadow_is_plain_fp32():
    model = quantize_model(_mlp(), preset("hdqt")).train()
    x, y = torch.randn(8, 12), torch.randint(0, 5, (8,))
    model(x)  # a step before: the counters have moved on from 0
    steps = quantizer_steps(model)
    torch.manual_seed(3)
    logits = model(x)
    g = torch.autograd.grad(F.cross_entropy(logits, y), logits, retain_graph=True)[0]
    logits.backward(g)
    copy_pass = _seeded_pass(replayed(model, steps), x, seed=3)
    got = copy_pass.backward(g)
    for name, layer in {"0": model[0], "3": model[3]}.items():
        assert torch.equal(got[name]["g_W"], layer.weight.grad), name

    plain = _mlp()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k in plain.state_dict()})
    torch.manual_seed(3)
    reference = plain(x)
    expected = torch.autograd.grad(reference, [plain[0].weight, plain[3].weight], g)
    shadow = _seeded_pass(float_shadow(model), x, seed=3).backward(g)
    assert torch.equal(shadow["0"]["g_W"], expected[0]) and torch.equal(shadow["3"]["g_W"], expected[1])
    assert fidelity(got["3"]["g_W"], shadow["3"]["g_W"])["cosine"] < 1


def test_a_diagnosed_batch_lets_go_of_its_passes_activations():
    """The logits' autograd graph holds the backward hooks that hold the pass: closed, nothing keeps it alive (each
    diagnosed batch once kept its two passes' activations for the run's life: gigabytes a run on a GPU)."""
    model = quantize_model(_mlp(), preset("hdqt")).train()
    x = torch.randn(8, 12)
    diagnosis = _Diagnosis(replayed(model, quantizer_steps(model)), float_shadow(model), x)
    for p in diagnosis.passes:
        p.forward()
    diagnosis.measures(torch.randn(8, 5), None)
    kept = [weakref.ref(p) for p in diagnosis.passes] + [weakref.ref(p.logits) for p in diagnosis.passes]
    diagnosis.close()
    del diagnosis, p
    gc.collect()
    assert all(ref() is None for ref in kept)


def _seeded_pass(model, x, seed):
    """A _Pass whose forward draws its dropout mask from `seed`, as a diagnosed batch's do."""
    p = _Pass(model, x)
    torch.manual_seed(seed)
    p.forward()
    return p


class _Scaled(nn.Module):
    """uint8 images made float inside the model, as under benchmark.augment_on=gpu."""

    def forward(self, x):
        return x.float() / 255


def test_an_integer_batch_is_diagnosed_without_a_gradient_of_its_own():
    torch.manual_seed(0)
    model = quantize_model(nn.Sequential(_Scaled(), nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), preset("hdqt"))
    x = torch.randint(0, 256, (4, 6), dtype=torch.uint8)
    pass_ = _Pass(model, x)
    pass_.forward()
    grads = pass_.backward(torch.randn(4, 3))
    pass_.close()
    assert "g_x" not in grads["1"] and grads["1"]["g_W"].shape == (8, 6)
    assert grads["3"]["g_x"].shape == (4, 8)


def test_the_watch_counts_underflow_by_role_and_keeps_the_largest_tile_sum():
    """Through the watch the ops give the same results; 4-bit levels of max 1 (scale 1/7): 0.01 and 0.04 round to
    level 0 (2 of the 4 nonzero values), 0.3 does not; 7 · 7 over a tile of 32 sums 1,568 against the limit 127."""
    layer = quantize_model(nn.Linear(64, 1), preset("hdqt"))
    watch = watched(nn.Sequential(layer))["0"]
    assert isinstance(watch, QuantizerWatch) and layer.ops_watch is watch
    ops = watch(TORCH_OPS)
    t = torch.tensor([0.0, 0.01, 1.0, -0.04, 0.3])
    counter = Counter(0, 0, layer.quant_index * ROLE_STRIDE + ROLE_CODES["grad_input.grad_output"])
    levels, scale = ops.quantize(t, QuantSpec(4), counter)
    assert torch.equal(levels, TORCH_OPS.quantize(t, QuantSpec(4), counter)[0])
    a, b = torch.full((1, 64), 7.0), torch.full((64, 1), 7.0)
    out = ops.scaled_int_matmul(a, b, torch.tensor(1.0), torch.tensor(1.0), tally=layer._tally("forward_saturated"))
    assert out.item() == 2 * 127
    watch.recording = False
    ops.quantize(torch.full((3,), 0.001), QuantSpec(4), counter)  # not recorded
    assert watch.record() == {"underflow": {"grad_input.grad_output": 0.5},
                              "tile_sums": {"forward": {"largest": 1568.0, "limit": 127}}}


def test_a_watched_copy_folds_its_input_gradient_as_the_step_does():
    """HOT's g_x folds the integer product into col2im where the kernels do (folds_col2im): through the watch too,
    so that the diagnosed copy runs what its training step ran, not a float-rows path of its own."""
    from hdqt_cil.kernels import COL2IM_PRODUCT_WIDTHS
    from hdqt_cil.quant.backend import KERNEL_OPS, folds_col2im

    watch = watched(nn.Sequential(quantize_model(nn.Linear(4, 4), preset("hot"))))["0"]
    width = min(COL2IM_PRODUCT_WIDTHS)
    assert folds_col2im(watch(KERNEL_OPS), width) and folds_col2im(KERNEL_OPS, width)
    assert not folds_col2im(watch(TORCH_OPS), width) and not folds_col2im(KERNEL_OPS, width + 1)


def test_the_diagnosed_gradient_is_the_steps_own_when_graphs_are_captured_first(monkeypatch):
    """A CUDA-graph capture runs the model's forward and a zero-gradient backward (its warm-up) inside the step's
    forward, and the replay runs no module forward: the G a diagnosed batch records is the replayed step's, taken
    at the output the strategy got, not the warm-up's zeros (with those, every fidelity measure of the batch was
    NaN)."""
    from types import SimpleNamespace

    model = _mlp()
    plugin = GradientDiagnostics(every=1)
    recorded = []
    monkeypatch.setattr(plugin, "_record", lambda strategy, steps, g, old: recorded.append(g))
    strategy = SimpleNamespace(is_training=True, model=model, mb_output=None, experience=SimpleNamespace(),
                               clock=SimpleNamespace(train_exp_iterations=0))
    x = torch.randn(8, 12)
    plugin.before_forward(strategy)
    y = model(x)  # the warm-up: the module's own forward, a backward of zeros
    torch.autograd.grad(y, list(model.parameters()), torch.zeros_like(y), allow_unused=True)
    first, last = model[0], model[3]  # the replay: the same function of the weights, no module forward
    strategy.mb_output = F.linear(F.relu(F.linear(x, first.weight, first.bias)), last.weight, last.bias)
    plugin.after_forward(strategy)
    g = torch.randn_like(strategy.mb_output)
    strategy.mb_output.backward(g)
    plugin.after_backward(strategy)
    assert len(recorded) == 1 and torch.equal(recorded[0], g)


class _NoModuleForward(SupervisedPlugin):
    """The strategy's training forward routed as trainer/cuda_graphs.py routes it to a replay, which computes the
    model's output without a module forward (here the model's forward method: no module hooks run)."""

    def before_training_exp(self, strategy, **kwargs):
        strategy.forward = lambda: strategy.model.forward(strategy.mb_x)

    def after_training_exp(self, strategy, **kwargs):
        del strategy.forward


@pytest.mark.parametrize("strategy", ["memo", "dyn_der", "er_ace", "der"])
def test_a_step_without_a_module_forward_is_diagnosed_as_an_eager_one(make_cfg, tmp_path, monkeypatch, strategy):
    """A step replayed from CUDA graphs runs no module forward: the diagnostics take G where both kinds of step put
    the model's output, so a run whose forward goes around the model's call records what the eager run records.
    Without that, MEMO and dyn_der failed at their second experience (G of the classifier's logits alone against
    the copies' logits and auxiliary outputs) and ER-ACE diagnosed the incoming batch with its stored batch's G
    (that forward is the model's own call); in G, MEMO's and dyn_der's auxiliary head, as their loss trains it."""
    overrides = (f"strategy={strategy}", "quant=hdqt", "trainer.epochs=1", "trainer.device=cpu",
                 "benchmark.n_experiences=2", "diagnostics=light", "diagnostics.every=4")
    eager = run(make_cfg(*overrides), tmp_path / "eager")
    build = experiment.build_strategy
    monkeypatch.setattr(experiment, "build_strategy", lambda *args: _with(build(*args), _NoModuleForward()))
    routed = run(make_cfg(*overrides), tmp_path / "routed")
    assert routed["acc_matrix"] == eager["acc_matrix"]
    records = [json.loads((tmp_path / name / "diagnostics.json").read_text()) for name in ("eager", "routed")]
    np.testing.assert_equal(records[1], records[0])
    assert [r["experience"] for r in records[0]] == [0, 1] and all(r["batches"] > 0 for r in records[0])
    if strategy in ("memo", "dyn_der"):
        assert 0 < records[0][1]["layers"]["aux_classifier"]["g_W"]["all"]["cosine"] < 1


def _with(strategy, plugin):
    strategy.plugins.append(plugin)
    return strategy


def test_kept_copies_record_what_fresh_copies_record():
    """ModelCopies refreshes its copies from the model's state between diagnosed batches (weights, BatchNorm
    statistics, modes, frozen layers) and makes them anew when the model grows: the records of fresh deep copies."""
    from types import SimpleNamespace

    def grown(model):  # a wider classifier, as an incremental one after a new experience
        old = model[4]
        model[4] = nn.Linear(old.in_features, old.out_features + 2)
        with torch.no_grad():
            model[4].weight[:old.out_features] = old.weight
        return quantize_model(model, preset("hdqt"))

    torch.manual_seed(0)
    model = quantize_model(nn.Sequential(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                                         nn.Linear(16, 5)), preset("hdqt")).train()
    kept, fresh = GradientDiagnostics(1), GradientDiagnostics(1)

    class Fresh(ModelCopies):
        def at(self, model, steps):
            return replayed(model, steps), float_shadow(model)

    fresh._copies = Fresh()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch in range(4):
        if batch == 2:
            model = grown(model)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        if batch == 3:
            model[0].weight.requires_grad_(False)
            model[1].eval()
        x = torch.randn(8, 12)
        steps = quantizer_steps(model)
        logits = model(x)
        g = torch.autograd.grad(F.cross_entropy(logits, torch.randint(0, 5, (8,))), logits, retain_graph=True)[0]
        strategy = SimpleNamespace(model=model, mb_x=x, clock=SimpleNamespace(train_iterations=batch))
        for plugin in (kept, fresh):
            plugin.experiences = [{"experience": 0, "batches": 0, "layers": {}}]
            plugin._record(strategy, steps, g, torch.arange(g.shape[-1]) < 2)
        assert kept.experiences == fresh.experiences, f"batch {batch}"
        restored = pickle.loads(pickle.dumps(kept))  # a checkpoint keeps the records, not the copies
        assert restored._copies.twin is None and restored.experiences == kept.experiences
        logits.backward(g)
        optimizer.step()
        optimizer.zero_grad()


def test_a_filter_normalised_direction_matches_each_filters_norm_and_leaves_biases():
    model = nn.Sequential(nn.Conv2d(3, 5, 3), nn.BatchNorm2d(5), nn.Flatten(), nn.Linear(5 * 4 * 4, 7))
    direction = filter_normalised_direction(model, torch.Generator().manual_seed(1))
    for name, weight in model.named_parameters():
        if weight.dim() < 2:
            assert not direction[name].any()
        else:
            torch.testing.assert_close(direction[name].flatten(1).norm(dim=1), weight.detach().flatten(1).norm(dim=1))


@pytest.mark.parametrize("scheme", ["hdqt", "fp32"])
def test_the_landscape_centre_is_the_models_loss_and_the_model_is_untouched(scheme):
    model = quantize_model(_mlp(), preset(scheme)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(2)]
    directions = tuple(filter_normalised_direction(model, g) for _ in range(2))
    found = loss_landscape(model, batches, directions, points=5, span=0.5)
    with torch.no_grad():
        expected = sum(F.cross_entropy(model(x), y, reduction="sum").item() for x, y in batches) / 16
    assert found["alphas"] == pytest.approx([-0.5, -0.25, 0, 0.25, 0.5])
    assert found["1d"][2] == pytest.approx(expected, rel=1e-6) and found["2d"][2][2] == pytest.approx(expected)
    assert found["2d"][0][2] == pytest.approx(found["1d"][0])  # β = 0 is the 1-D slice
    assert len(set(found["1d"])) == 5
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_layers_written_without_their_order_are_read_in_the_models():
    from hdqt_cil.results.diagnostics import layer_order

    names = ["classifier", "features.1.conv1", "features.1.stages.0.10.conv1", "features.1.stages.0.2.conv1",
             "features.1.stages.1.0.conv1"]
    assert layer_order({"layers": dict.fromkeys(names)}) == [names[1], names[3], names[2], names[4], names[0]]
    assert layer_order({"layers": dict.fromkeys(names), "layer_order": names}) == names


def _light(make_cfg, quant, *more):
    return make_cfg("strategy=lwf", f"quant={quant}", "trainer.epochs=2", "trainer.device=cpu",
                    "benchmark.n_experiences=null", "benchmark.classes_per_exp=4", *more)


def test_a_run_records_fidelity_per_layer_and_experience_without_changing_its_numbers(make_cfg, tmp_path):
    plain = run(_light(make_cfg, "hdqt"), tmp_path / "off")
    measured = run(_light(make_cfg, "hdqt", "diagnostics=light", "diagnostics.every=4"), tmp_path / "light")
    assert measured["acc_matrix"] == plain["acc_matrix"] and measured["train_loss"] == plain["train_loss"]
    records = json.loads((tmp_path / "light" / "diagnostics.json").read_text())
    assert [r["experience"] for r in records] == [0, 1, 2] and all(r["batches"] > 0 for r in records)
    first_layer = [next(iter(r["layers"].values())) for r in records]
    assert set(first_layer[0]["g_W"]) == {"all"} and set(first_layer[1]["g_W"]) == {"all", "old", "new"}
    assert 0 < first_layer[1]["g_W"]["all"]["cosine"] < 1
    assert set(first_layer[1]["stats"]) == {"input", "weight", "grad_output", "g_x", "g_W"}
    assert all("g_x" in layer and "g_W" in layer for layer in records[1]["layers"].values())  # the first layer too
    assert [e["experience"] for e in measured["diagnostics"]] == [0, 1, 2]
    assert "diagnostics" not in plain
    # the layers' order in the model, which the file's sorted keys lose (classifier first)
    assert records[0]["layer_order"][-1] == "classifier" and next(iter(records[0]["layers"])) == "classifier"
    assert sorted(records[0]["layer_order"]) == sorted(records[0]["layers"])
    roles = {"input", "weight", "grad_input.grad_output", "grad_input.weight", "grad_weight.grad_output",
             "grad_weight.input"}
    for layer in records[1]["layers"].values():
        assert set(layer["underflow"]) <= roles and "grad_input.grad_output" in layer["underflow"]
        assert all(0 <= share < 1 for share in layer["underflow"].values())
        assert {kept["limit"] for kept in layer["tile_sums"].values()} == {127}  # HDQT's 8-bit accumulators
        assert all(kept["largest"] > 0 for kept in layer["tile_sums"].values())
    assert set(measured["diagnostics"][1]["largest tile sum / limit"]) == {"forward", "grad_input", "grad_weight"}
    # the forwards: the first layer in the forward takes the batch itself in both copies, the later ones drift;
    # the logits by part
    inputs = sorted((layer["input"]["all"] for layer in records[1]["layers"].values()), key=lambda i: i["rel_error"])
    assert inputs[0]["rel_error"] == 0 and inputs[0]["cosine"] == pytest.approx(1)
    assert all(0 < i["cosine"] < 1 and i["rel_error"] > 0 for i in inputs[1:])
    assert set(records[0]["logits"]) == {"all"} and set(records[1]["logits"]) == {"all", "old", "new"}
    assert all(0 < m["cosine"] < 1 for m in records[1]["logits"].values())
    assert measured["diagnostics"][1]["logits"] == records[1]["logits"]

    make_tables([tmp_path / "light"], tmp_path / "tables")
    rows = (tmp_path / "tables" / "fidelity.md").read_text().splitlines()
    assert "g_W cosine old classes" in rows[0] and len(rows) == 2 + len(records[1]["layers"]) + 1  # and the logits
    header = [c.strip() for c in rows[0].split("|")]
    cells = [dict(zip(header, (c.strip() for c in row.split("|")))) for row in rows[2:]]
    logits = next(row for row in cells if row["layer"] == "logits")
    assert {row["logits cosine"] for row in cells if row is not logits} == {"–"}  # a layer has no logits
    assert logits["g_W cosine"] == "–" and float(logits["logits cosine"]) > 0  # the logits have no weight gradient
    assert (tmp_path / "tables" / "fidelity.png").stat().st_size > 0
    assert "| grad_output |" in (tmp_path / "tables" / "gradient_stats.md").read_text()
    table = (tmp_path / "tables" / "quantizers.md").read_text().splitlines()
    header = [c.strip() for c in table[0].split("|")]
    assert "underflow grad_input.grad_output" in header and "grad_weight tile sum / limit" in header
    assert not any(c.strip() == "nan" for row in table[2:] for c in row.split("|"))  # not applicable: '–'
    # the run's quant_stats.json shares beside them: the means over its epochs (one experience's layer by hand)
    epochs = json.loads((tmp_path / "light" / "quant_stats.json").read_text())
    layer = next(iter(records[0]["layers"]))
    row = dict(zip(header, next(r for r in table[2:] if f"| {layer} |" in r).split("|")))
    expected = np.mean([e["layers"][layer]["input_clipped"] for e in epochs])
    assert float(row["clipped input"]) == pytest.approx(expected, abs=5e-4)
    assert {"clipped weight", "saturated forward", "saturated grad_weight"} <= set(header)
    # by experience: the mean over layers of each cosine, and the products' largest tile sums over the layers
    table = (tmp_path / "tables" / "fidelity_by_experience.md").read_text().splitlines()
    header = [c.strip() for c in table[0].split("|")]
    assert len(table) == 2 + len(records)
    second = dict(zip(header, table[3].split("|")))
    layers = records[1]["layers"].values()
    assert float(second["experience"]) == 2 and float(second["seeds"]) == 1
    expected = np.nanmean([layer["g_W"]["old"]["cosine"] for layer in layers])
    assert float(second["g_W cosine old"]) == pytest.approx(expected, abs=5e-4)
    higher = expected > np.nanmean([layer["g_W"]["new"]["cosine"] for layer in layers])
    assert second["g_W old > new, seeds"].strip() == str(int(higher))  # a count of seeds, also of one
    assert dict(zip(header, table[2].split("|")))["g_W old > new, seeds"].strip() == "–"  # no old classes yet
    assert float(second["logits cosine old"]) == pytest.approx(records[1]["logits"]["old"]["cosine"], abs=5e-4)
    reach = max(layer["tile_sums"]["forward"]["largest"] / layer["tile_sums"]["forward"]["limit"] for layer in layers)
    assert float(second["forward tile sum / limit"]) == pytest.approx(reach, abs=5e-4)

    # a tagged run set (`tag=acc12`) gets rows of its own, not means taken with the untagged runs'
    shutil.copytree(tmp_path / "light", tmp_path / "tagged")
    summary = json.loads((tmp_path / "tagged" / "summary.json").read_text())
    summary["run"]["tag"] = "acc12"
    (tmp_path / "tagged" / "summary.json").write_text(json.dumps(summary))
    make_tables([tmp_path / "light", tmp_path / "tagged"], tmp_path / "both")
    per_run = {"fidelity.md": len(records[1]["layers"]) + 1, "quantizers.md": len(records[1]["layers"]),
               "fidelity_by_experience.md": len(records)}
    for name, count in per_run.items():
        rows = (tmp_path / "both" / name).read_text().splitlines()
        assert "| tag |" in rows[0] and len(rows) == 2 + 2 * count
        assert sum("| acc12 |" in r for r in rows) == count


def test_under_hot_the_forwards_agree_and_the_backward_is_what_differs(make_cfg, tmp_path):
    """HOT's forward is float: the quantized copy's inputs and logits are the shadow's; its integer backward moves the
    gradients, its four backward quantizers report their underflow, and no product has a narrow accumulator."""
    summary = run(_light(make_cfg, "hot", "diagnostics=light", "diagnostics.every=4"), tmp_path / "hot")
    records = json.loads((tmp_path / "hot" / "diagnostics.json").read_text())
    later = records[1]
    assert all(part["rel_error"] == 0 for part in later["logits"].values()) and set(later["logits"]) == {
        "all", "old", "new"}
    backward_roles = {"grad_input.grad_output", "grad_input.weight", "grad_weight.grad_output", "grad_weight.input"}
    for layer in later["layers"].values():
        assert layer["input"]["all"]["rel_error"] == 0
        assert 0 < layer["g_W"]["all"]["cosine"] < 1 and layer["g_W"]["old"]["rel_error"] > 0
        assert set(layer["underflow"]) == backward_roles and "tile_sums" not in layer
    assert "largest tile sum / limit" not in summary["diagnostics"][1]


def test_a_full_run_records_a_landscape_per_experience_without_changing_its_numbers(make_cfg, tmp_path):
    summary = run(_light(make_cfg, "hdqt", "diagnostics=full", "diagnostics.every=20", "diagnostics.landscape_points=3",
                         "diagnostics.landscape_batches=1"), tmp_path / "full")
    plain = run(_light(make_cfg, "hdqt"), tmp_path / "off")
    assert summary["acc_matrix"] == plain["acc_matrix"] and summary["train_loss"] == plain["train_loss"]
    records = json.loads((tmp_path / "full" / "diagnostics.json").read_text())
    assert all(set(r["landscape"]) == {"quantized", "float"} for r in records)
    assert all(len(r["landscape"]["quantized"]["2d"]) == 3 for r in records)
    assert set(summary["diagnostics"][0]["landscape"]["float"]) == {"centre", "rise"}
    # the old experiences' test loss, from the second experience on, along the same directions
    assert "old_test_landscape" not in records[0]
    assert all(set(r["old_test_landscape"]) == {"quantized", "float"} for r in records[1:])
    assert all(r["old_test_landscape"]["quantized"]["1d"] != r["landscape"]["quantized"]["1d"] for r in records[1:])
    assert set(summary["diagnostics"][1]["old_test_landscape"]["quantized"]) == {"centre", "rise"}
    make_tables([tmp_path / "full"], tmp_path / "tables")
    assert (tmp_path / "tables" / "landscape_lwf.png").stat().st_size > 1000
    table = (tmp_path / "tables" / "landscape.md").read_text().splitlines()
    header = [c.strip() for c in table[0].split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.split("|")))) for line in table[2:]]
    assert [row["experience"] for row in rows] == ["1", "2", "3"]
    for row, entry in zip(rows, summary["diagnostics"]):  # the summary's rule, rounded
        assert float(row["train rise (float)"]) == pytest.approx(entry["landscape"]["float"]["rise"], abs=5e-4)
        assert float(row["train loss"]) == pytest.approx(entry["landscape"]["quantized"]["centre"], abs=5e-4)
    assert rows[0]["old test loss"] == "–" and float(rows[1]["old test rise"]) == pytest.approx(
        summary["diagnostics"][1]["old_test_landscape"]["quantized"]["rise"], abs=5e-4)
    # a loss that was not finite: null in the file (JSON has no inf), missing in the table, a gap in the plot
    records[0]["landscape"]["quantized"]["1d"][1] = math.inf  # the centre of three points
    write_json(tmp_path / "full" / "diagnostics.json", records)
    text = (tmp_path / "full" / "diagnostics.json").read_text()
    json.loads(text, parse_constant=lambda constant: pytest.fail(f"diagnostics.json holds a bare {constant}"))
    make_tables([tmp_path / "full"], tmp_path / "again")
    table = (tmp_path / "again" / "landscape.md").read_text().splitlines()
    first = dict(zip(header, (c.strip() for c in table[2].split("|"))))
    assert (first["train loss"], first["train rise"]) == ("–", "–") and first["train loss (float)"] == rows[0][
        "train loss (float)"]
    assert (tmp_path / "again" / "landscape_lwf.png").stat().st_size > 1000


def test_a_slices_rise_is_its_ends_mean_above_its_centre():
    assert slice_summary([3.0, 1.0, 0.5, 2.0, 4.0]) == {"centre": 0.5, "rise": 3.0}
    assert slice_summary([0.0, 1.0, -1.0])["rise"] == -1.5  # no minimum along the direction


def test_under_fp32_every_gradient_is_its_own_reference(make_cfg, tmp_path):
    summary = run(_light(make_cfg, "fp32", "diagnostics=light", "diagnostics.every=6"), tmp_path / "run")
    for experience in summary["diagnostics"]:
        for measures in experience["mean over layers"].values():
            assert measures["cosine"] == pytest.approx(1, abs=1e-12) and measures["rel_error"] == 0
    np.testing.assert_equal(len(summary["diagnostics"]), 3)


def test_bad_diagnostics_settings_are_refused(make_cfg):
    from hdqt_cil.config import validate

    with pytest.raises(ValueError, match="diagnostics.every=0 must be a positive integer"):
        validate(make_cfg("diagnostics=light", "diagnostics.every=0"))
    with pytest.raises(ValueError, match="diagnostics.landscape_points=4 must be an odd integer"):
        validate(make_cfg("diagnostics=full", "diagnostics.landscape_points=4"))


def test_a_float_formats_quantizers_report_their_underflow():
    """fp8's E4M3 inputs: a value far below the tensor's largest (its scale maps the largest to 448) rounds to 0."""
    layer = quantize_model(nn.Linear(4, 3), preset("fp8")).train()
    watch = watched(nn.Sequential(layer))["0"]
    x = torch.tensor([[1.0, 1e-9, -2.0, 0.0], [0.5, 3.0, 1e-12, 1.0]], requires_grad=True)
    layer(x).sum().backward()
    shares = watch.record()["underflow"]
    assert shares["input"] == pytest.approx(2 / 7)  # 1e-9 and 1e-12 of the 7 nonzero inputs
    assert {"weight", "grad_input.grad_output", "grad_weight.input"} <= set(shares)


def test_a_float_accumulators_largest_tile_sum_is_kept_against_the_formats_largest_value():
    """quant=fp (E5M2 operands, E5M2 tile sums of 32): the forward's largest tile sum is the largest |sum| of a K
    tile of the rounded operands' products, by hand, kept with the E5M2 quantizer's largest value; a scheme with
    no accumulator format keeps none."""
    from hdqt_cil.quant.floats import authors_float

    torch.manual_seed(4)
    layer = quantize_model(nn.Linear(70, 3), preset("fp")).train()
    watch = watched(nn.Sequential(layer))["0"]
    x = (torch.randn(5, 70) * torch.linspace(0.1, 30, 70)).requires_grad_()
    layer(x).sum().backward()
    kept = watch.record()["tile_sums"]
    xq, wq = authors_float(x.detach(), 5, 2), authors_float(layer.weight.detach(), 5, 2)
    by_hand = max((xq[:, s:s + 32] @ wq[:, s:s + 32].T).abs().max().item() for s in range(0, 70, 32))
    assert kept["forward"]["largest"] == pytest.approx(by_hand, rel=1e-6)
    assert kept["forward"]["limit"] == 2.0**16 * 1.75  # E5M2 in the authors' quantizer: 2^(31 - 15) · (2 - 2^-2)
    assert {"grad_input", "grad_weight"} <= set(kept)

    plain = quantize_model(nn.Linear(70, 3), preset("fp8")).train()
    plain_watch = watched(nn.Sequential(plain))["0"]
    plain(x).sum().backward()
    assert plain_watch.record()["tile_sums"] == {}


def test_landscape_plots_scale_to_losses_apart_by_decades_and_contour_past_outliers():
    from hdqt_cil.results.diagnostics import _contour_levels, _spans_decades
    assert _spans_decades([0.1, 0.2, 0.3, 3e6]) and not _spans_decades([0.1, 2.0, 5.0, 0.0])
    grid = np.add.outer(np.linspace(0, 1, 21), np.linspace(0, 1, 21)) / 2
    grid[0, 0] = 1e6  # one point far off: the levels stay among the others
    levels = _contour_levels(grid)
    assert len(levels) == 15 and np.all(np.diff(levels) > 0) and levels.max() <= 1.0


def test_an_integer_batch_is_diagnosed_without_torch_warning_of_its_missing_input_gradient():
    """Images augmented on the GPU reach the model as uint8 (normalised inside it): the first layer's full backward
    hook fires without an input gradient, which the diagnosis expects (it keeps no g_x there) and does not warn of."""
    torch.manual_seed(0)
    model = quantize_model(build_model("resnet32", (3, 8, 8), 4, ((0.5,) * 3, (0.25,) * 3)), preset("fp"))
    x = torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8)
    logits = model(x)
    g, = torch.autograd.grad(F.cross_entropy(logits, torch.arange(4)), logits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        record = diagnose_batch(model, x, g)
    first = next(iter(record["layers"].values()))
    assert "g_W" in first and not first["g_x"] and 0 < first["g_W"]["all"]["cosine"] <= 1 + 1e-6


def test_a_growing_models_layers_stand_once_in_the_tables_at_their_last_place(tmp_path):
    """MEMO adds an extractor each experience, which moves every later layer's place in the model."""
    from hdqt_cil.results.diagnostics import diagnostics_frame, fidelity_table, quantizer_table, statistics_table

    measures = {"cosine": 0.5, "rel_error": 0.1, "sign": 0.9}
    layer = {"g_W": {"all": measures}, "underflow": {"input": 0.1},
             "stats": {"input": {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 1.0}}}
    orders = [["extractors.0", "trunk", "classifier"], ["extractors.0", "extractors.1", "trunk", "classifier"]]
    records = [{"experience": e, "layer_order": order, "layers": dict.fromkeys(order, layer),
                "logits": {"all": measures}} for e, order in enumerate(orders)]
    (tmp_path / "diagnostics.json").write_text(json.dumps(records))
    runs = pd.DataFrame([{"path": str(tmp_path), "benchmark": "b", "strategy": "memo", "scheme": "hdqt", "seed": 0}])
    fidelity, statistics, quantizers = diagnostics_frame(runs)
    table = fidelity_table(fidelity)
    assert list(table.layer) == orders[1] + ["logits"]
    assert dict(zip(table.layer, table.n)) == {"extractors.0": 2, "extractors.1": 1, "trunk": 2, "classifier": 2,
                                               "logits": 2}
    assert list(statistics_table(statistics).layer) == list(quantizer_table(quantizers).layer) == orders[1]


def test_the_fidelity_plot_names_layers_only_where_every_models_layer_at_a_place_is_the_same():
    from hdqt_cil.results.diagnostics import layer_names

    resnet = pd.DataFrame({"strategy": "lwf", "position": [0, 1, 2], "layer": ["stem", "block", "classifier"]})
    assert layer_names(pd.concat([resnet, resnet.assign(strategy="icarl")])) == {0: "stem", 1: "block",
                                                                                    2: "classifier"}
    memo = pd.DataFrame({"strategy": "memo", "position": [0, 1], "layer": ["extractors.0", "trunk"]})
    assert layer_names(pd.concat([resnet, memo])) is None
