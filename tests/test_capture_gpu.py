"""Training steps replayed from CUDA graphs (trainer.cuda_graph) against the same steps run eagerly: bit-identical
weights, statistics and counters; eager fallback where a graph does not apply; NaN checks that still fire."""
import copy
import dataclasses
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from hdqt_cil import kernels
from hdqt_cil.experiment import run
from hdqt_cil.models import build_model
from hdqt_cil.quant import NonFiniteError, layer_steps, preset, quant_stats, quantize_model
from hdqt_cil.quant import streams
from hdqt_cil.quant.float_schemes import FloatScheme
from hdqt_cil.graph_replay import CapturedInference, CapturedTraining
from hdqt_cil.strategies.icarl import DeviceHerding
from hdqt_cil.trainer.cuda_graphs import CudaGraphPlugin

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(torch.cuda.is_available() and not kernels.available(),
                                 reason=f"kernels unavailable: {kernels.unavailable_reason()}")]

SHAPES = {"mlp": ((561,), 11), "resnet32": ((3, 32, 32), 10)}


def make_model(model_name, scheme_name, backend="cupy"):
    """The model under a scheme on the GPU path: `backend` for the integer schemes, auto (the tensor cores) for
    the float formats, whose backends are auto and torch."""
    torch.manual_seed(0)
    shape, classes = SHAPES[model_name]
    model = build_model(model_name, shape, classes).cuda()
    if scheme_name != "fp32":
        scheme = preset(scheme_name)
        gpu_path = "auto" if isinstance(scheme, FloatScheme) else backend
        quantize_model(model, dataclasses.replace(scheme, backend=gpu_path))
    return model


def train(model, call, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(call(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize()


def make_batches(model_name, sizes, seed=1):
    shape, classes = SHAPES[model_name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.randn(n, *shape, generator=g, device="cuda"), torch.randint(0, classes, (n,), generator=g,
                                                                               device="cuda")) for n in sizes]


def assert_same_state(a, b):
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert layer_steps(a) == layer_steps(b)
    assert quant_stats(a) == quant_stats(b)


@pytest.fixture(autouse=True)
def _deterministic_cudnn():
    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True  # FP32's and HOT's float convolutions
    yield
    torch.backends.cudnn.deterministic = before


@pytest.mark.parametrize("model_name", ["mlp", "resnet32"])
@pytest.mark.parametrize("scheme_name", ["fp32", "hdqt", "int4", "luq", "hot", "fp8", "mxfp4", "nvfp4", "fp"])
def test_graph_steps_equal_eager_steps(model_name, scheme_name):
    """Three steps on fresh batches, then a shorter last batch (a second captured shape)."""
    batches = make_batches(model_name, [128, 128, 128, 40])
    eager = make_model(model_name, scheme_name)
    graphed = copy.deepcopy(eager)
    train(eager, eager, batches)
    captured = CapturedTraining(graphed)
    train(graphed, captured, batches)
    captured.check()
    assert captured.replays == 4 and len(captured.graphs) == 2
    assert_same_state(eager, graphed)


@pytest.mark.parametrize("scheme_name", ["hdqt", "int4", "luq", "hot", "fp8", "mxfp4"])
def test_two_stream_backwards_give_the_one_stream_bits(scheme_name, monkeypatch):
    """Each layer's weight gradient on a side stream beside its input gradient (quant/streams.py), eagerly and
    replayed, gives what the layers compute on one stream."""
    batches = make_batches("resnet32", [128, 128, 128])
    one_stream = make_model("resnet32", scheme_name)
    two_streams, graphed = copy.deepcopy(one_stream), copy.deepcopy(one_stream)
    monkeypatch.setattr(streams, "PARALLEL", False)
    train(one_stream, one_stream, batches)
    monkeypatch.setattr(streams, "PARALLEL", True)
    streams._side_streams.clear()
    train(two_streams, two_streams, batches)
    assert streams._side_streams, "no backward forked a side stream"
    captured = CapturedTraining(graphed)
    train(graphed, captured, batches)
    captured.check()
    assert_same_state(one_stream, two_streams)
    assert_same_state(one_stream, graphed)


def relative_distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """||a - b|| / ||b|| over every float tensor of the two modules' states (weights, BatchNorm statistics)."""
    pairs = [(p.double(), q.double()) for p, q in zip(a.state_dict().values(), b.state_dict().values())
             if p.is_floating_point()]
    return (sum((p - q).norm() ** 2 for p, q in pairs) / sum(q.norm() ** 2 for _, q in pairs)).sqrt().item()


@pytest.mark.parametrize("model_name", ["mlp", "resnet32"])
def test_compiled_graph_steps_follow_the_eager_steps(model_name):
    """trainer.compile: the captured step is inductor's (BatchNorm and ReLU fused, so FP32's rounding moves), for
    each shape captured. After four steps the weights lie as close to the eager ones as FP32's own rounding puts
    another eager run (the same steps in the channels-last layout, whose kernels round differently; at ResNet-32's
    initialisation such differences reach ~1 % of some BatchNorm gradients), and not at the distance that stale
    weights or a lost update would."""
    batches = make_batches(model_name, [128, 128, 128, 40])
    eager = make_model(model_name, "fp32")
    start, compiled, other = (copy.deepcopy(eager) for _ in range(3))
    train(eager, eager, batches)
    layout = torch.channels_last if model_name == "resnet32" else torch.contiguous_format
    other.to(memory_format=layout)
    train(other, lambda x: other(x.contiguous(memory_format=layout) if x.dim() == 4 else x), batches)
    torch._dynamo.utils.counters.clear()
    captured = CapturedTraining(compiled, compiled=True)
    train(compiled, captured, batches)
    assert captured.replays == 4 and len(captured.graphs) == 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the captures ran compiled code
    noise = relative_distance(other, eager)
    assert relative_distance(compiled, eager) <= max(4 * noise, 1e-5) < relative_distance(start, eager) / 10


def test_other_calls_run_eagerly_with_the_same_results():
    """Beyond max_shapes, in eval, under no_grad: the module itself, and the counters stay in step."""
    batches = make_batches("resnet32", [64, 64, 32, 64])
    eager = make_model("resnet32", "hdqt")
    graphed = copy.deepcopy(eager)
    train(eager, eager, batches)
    captured = CapturedTraining(graphed, max_shapes=1)
    train(graphed, captured, batches)
    assert captured.replays == 3 and len(captured.graphs) == 1
    assert_same_state(eager, graphed)
    x = batches[0][0]
    graphed.eval()
    with torch.no_grad():
        assert torch.equal(captured(x), eager.eval()(x))
    assert captured.replays == 3


def test_capture_after_eager_steps_whose_graph_is_still_held():
    """A loss kept from an eager step (avalanche keeps the last one) holds autograd nodes of the default stream."""
    batches = make_batches("mlp", [32, 32, 32])
    eager = make_model("mlp", "hdqt")
    graphed = copy.deepcopy(eager)
    x, y = batches[0]
    train(eager, eager, batches[:1])
    eager(x)  # the extra forward below (it advances the layers' steps)
    train(eager, eager, batches[1:])
    train(graphed, graphed, batches[:1])
    kept = F.cross_entropy(graphed(x), y)
    captured = CapturedTraining(graphed)
    train(graphed, captured, batches[1:])
    assert captured.replays == 2 and kept.grad_fn is not None
    assert_same_state(eager, graphed)


def test_capture_keeps_autograd_on_one_stream():
    """No AccumulateGrad node made on the warm-up stream may serve the capture (torch warns of a stream mismatch
    and an extra synchronisation when one does)."""
    model = make_model("mlp", "hdqt")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*AccumulateGrad node's stream")
        train(model, CapturedTraining(model), make_batches("mlp", [128, 128, 128]))


def test_freezing_parameters_captures_again():
    batches = make_batches("mlp", [32, 32, 32])
    eager = make_model("mlp", "hdqt")
    graphed = copy.deepcopy(eager)
    captured = CapturedTraining(graphed)
    for model, call in ((eager, eager), (graphed, captured)):
        train(model, call, batches[:1])
        model.classifier.weight.requires_grad_(False)
        train(model, call, batches[1:])
    assert captured.replays == 3 and len(captured.graphs) == 1
    assert_same_state(eager, graphed)


def test_a_nan_in_a_replayed_step_names_the_layer():
    model = make_model("mlp", "hdqt")
    captured = CapturedTraining(model)
    (x, y), = make_batches("mlp", [32])
    train(model, captured, [(x, y)])
    captured.check()  # finite so far
    x = x.clone()
    x[3, 5] = float("nan")
    train(model, captured, [(x, y)])
    with pytest.raises(NonFiniteError, match=r"layer '[\w.]+': a non-finite value \(nan\) reached a quantizer "
                                             r"of the forward pass"):
        captured.check()


def test_the_torch_reference_backend_replays_the_same_steps():
    batches = make_batches("mlp", [64, 64, 64])
    eager = make_model("mlp", "hdqt", backend="torch")
    graphed = copy.deepcopy(eager)
    train(eager, eager, batches)
    captured = CapturedTraining(graphed)
    train(graphed, captured, batches)
    assert captured.replays == 3
    assert_same_state(eager, graphed)


@pytest.mark.parametrize("scheme_name", ["hdqt", "luq", "hot"])
def test_captured_inference_equals_the_eager_forward(scheme_name):
    """An old model's forward (eval, no gradients) replayed from graphs: the eager bits, two shapes captured, a
    third run eagerly, and no training state moved."""
    model = make_model("resnet32", scheme_name).eval()
    wrapped = CapturedInference(model)
    steps = layer_steps(model)
    g = torch.Generator(device="cuda").manual_seed(5)
    with torch.no_grad():
        for batch in (32, 32, 7, 32, 7, 5):
            x = torch.randn(batch, 3, 32, 32, generator=g, device="cuda")
            assert torch.equal(wrapped(x), model(x)), batch
    assert len(wrapped.graphs) == 2 and wrapped.replays == 5
    assert layer_steps(model) == steps
    wrapped.check()


class _Strategy:
    """What CudaGraphPlugin reads of an avalanche strategy: the model, the phase, the minibatch and `forward`."""
    is_training, plugins = False, []

    def __init__(self, model):
        self.model = model

    def forward(self):
        return self.model(self.mb_x)


def test_evaluation_runs_from_graphs_and_hands_the_forward_back():
    """Evaluation inside and outside a training experience goes through the graphs with the eager bits; the
    strategy's own forward comes back when neither phase is on (checkpoints pickle it)."""
    model = make_model("resnet32", "hdqt")
    strategy, plugin = _Strategy(model), CudaGraphPlugin()
    g = torch.Generator(device="cuda").manual_seed(9)
    for training_phase in (False, True):
        if training_phase:
            plugin.before_training_exp(strategy)
        plugin.before_eval(strategy)
        inference = plugin.inference
        model.eval()
        with torch.no_grad():
            for batch in (16, 16, 5):
                strategy.mb_x = torch.randn(batch, 3, 32, 32, generator=g, device="cuda")
                assert torch.equal(strategy.forward(), model(strategy.mb_x)), batch
        assert inference.replays == 3 and len(inference.graphs) == 2
        plugin.after_eval(strategy)
        assert ("forward" in vars(strategy)) == training_phase and plugin.inference is None
        if training_phase:
            plugin.after_training_exp(strategy)
        assert "forward" not in vars(strategy)


def test_herding_reads_its_features_from_graphs_in_the_eager_order():
    """The exemplar memory's herding through CudaGraphPlugin.graphed: the eager order on a quantized model, the
    feature extractor's two batch shapes captured, the extractor handed back and its graphs freed afterwards."""
    model = make_model("resnet32", "hdqt").eval()
    herding = DeviceHerding(model, "features")
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(40, 3, 32, 32, generator=g), torch.zeros(40))
    strategy = SimpleNamespace(device=torch.device("cuda"), eval_mb_size=16)
    eager, extractor = herding.make_sorted_indices(strategy, data), herding.feature_extractor
    with CudaGraphPlugin().graphed(herding, "feature_extractor"):
        wrapped = herding.feature_extractor
        graphed = herding.make_sorted_indices(strategy, data)
        assert isinstance(wrapped, CapturedInference) and len(wrapped.graphs) == 2 and wrapped.replays == 3
    assert graphed == eager
    assert herding.feature_extractor is extractor and not wrapped.graphs


@pytest.mark.parametrize("strategy,quant,extra", [
    ("lwf", "hdqt", []), ("icarl", "hdqt", []), ("icarl", "hdqt", ["strategy.loss=bce", "strategy.eval_head=nme"]),
    ("bic", "hdqt", ["strategy.stage_2_epochs=2"]), ("bic", "hot", ["strategy.stage_2_epochs=2"]),
    ("joint", "int4", []), ("naive", "fp32", []),
    ("replay", "hdqt", []), ("der", "hdqt", []), ("er_ace", "hdqt", []), ("gdumb", "hdqt", []), ("agem", "hdqt", []),
    ("ewc", "hdqt", []), ("si", "hdqt", []), ("dyn_der", "hdqt", []), ("memo", "hdqt", []),
    ("icarl", "hdqt", ["trainer.weight_bits=8"]),
    ("icarl", "hdqt", ["strategy.hp_replay=40"]), ("icarl", "hdqt", ["diagnostics=light", "diagnostics.every=2"]),
    ("lwf", "mxfp4", ["diagnostics=light", "diagnostics.every=2"]), ("icarl", "fp8", []), ("bic", "nvfp4", []),
    ("lwf", "hot", ["diagnostics=light", "diagnostics.every=2"]),
    ("lwf", "int4", ["diagnostics=light", "diagnostics.every=2"]),
    ("memo", "hdqt", ["diagnostics=light", "diagnostics.every=2"]),  # G of the logits and the auxiliary head
    ("er_ace", "hdqt", ["diagnostics=light", "diagnostics.every=2"]),  # G of the incoming batch, not the stored one
    ("icarl", "fp", []),
    ("bic", "int4", ["strategy.hp_replay=40", "strategy.stage_2_epochs=2"]),
])
def test_experiment_with_cuda_graphs_gives_the_same_results(make_cfg, tmp_path, strategy, quant, extra):
    """The whole run through the plugin: accuracy matrix and per-epoch losses as the eager run's."""
    overrides = [f"strategy={strategy}", f"quant={quant}", "trainer.epochs=2", "trainer.device=cuda", *extra]
    eager = run(make_cfg(*overrides, "trainer.cuda_graph=false"), tmp_path / "eager")
    graphed = run(make_cfg(*overrides, "trainer.cuda_graph=true"), tmp_path / "graphed")
    assert graphed["status"] == eager["status"] == "complete"
    assert eager["peak_memory_mib"] > 0 and graphed["peak_memory_mib"] > 0
    np.testing.assert_array_equal(np.array(graphed["acc_matrix"], dtype=float),
                                  np.array(eager["acc_matrix"], dtype=float))
    assert graphed["train_loss"] == eager["train_loss"]
    assert graphed["class_acc"] == eager["class_acc"]
    np.testing.assert_equal(graphed.get("diagnostics"), eager.get("diagnostics"))  # NaN where both have one


@pytest.mark.parametrize("sliced", [False, True])
def test_lwf_under_hot_on_a_resnet_diagnosed_from_graphs_records_what_the_eager_run_records(make_cfg, tmp_path,
                                                                                             sliced):
    """The CIFAR-10 table's LwF HOT run in small: ResNet-32 at batch 128 with LQS (per token in most layers), the
    images augmented on the GPU, both unfolds, diagnosed batches captured again once old classes exist; the graphed
    run gives the eager run's numbers and records."""
    from test_cifar import write_torchvision_cifar

    write_torchvision_cifar(tmp_path / "data", "cifar10", per_class_train=128, per_class_test=4)
    overrides = ["benchmark=cifar10", "benchmark.verify=false", "benchmark.augment_on=gpu", "model=resnet32",
                 "strategy=lwf", "quant=hot", f"quant.sliced_unfold={sliced}", "trainer.epochs=2",
                 "trainer.batch_size=128", "trainer.device=cuda", "diagnostics=light", "diagnostics.every=2"]
    eager = run(make_cfg(*overrides, "trainer.cuda_graph=false"), tmp_path / "eager")
    graphed = run(make_cfg(*overrides, "trainer.cuda_graph=true"), tmp_path / "graphed")
    assert graphed["status"] == eager["status"] == "complete"
    assert graphed["acc_matrix"] == eager["acc_matrix"] and graphed["train_loss"] == eager["train_loss"]
    np.testing.assert_equal(graphed["diagnostics"], eager["diagnostics"])
    assert [e["experience"] for e in graphed["diagnostics"]] == [0, 1, 2, 3, 4]


def test_a_compiled_fp32_experiment_runs_and_trains_like_the_eager_one(make_cfg, tmp_path):
    overrides = ["strategy=icarl", "quant=fp32", "trainer.epochs=2", "trainer.device=cuda"]
    eager = run(make_cfg(*overrides), tmp_path / "eager")
    compiled = run(make_cfg(*overrides, "trainer.compile=true"), tmp_path / "compiled")
    assert compiled["status"] == eager["status"] == "complete"
    np.testing.assert_allclose(compiled["train_loss"][0], eager["train_loss"][0], rtol=1e-3)


def test_graphs_and_their_branches_keep_streams_of_their_own():
    """cuBLAS's workspace is its stream's: the steps' and the diagnoses' capture streams and the side streams their
    layers' backwards fork during a capture are four streams, none of which eager work ever draws (torch hands out
    the streams of a priority in turn)."""
    from hdqt_cil.graph_replay import capturing_into

    def capture_and_side(beside):
        with capturing_into(torch.cuda.CUDAGraph(), beside=beside):
            current = torch.cuda.current_stream()
            return current.cuda_stream, streams._side_stream(current).cuda_stream
    kept = [*capture_and_side(False), *capture_and_side(True)]
    drawn = {torch.cuda.Stream().cuda_stream for _ in range(100)}
    eager_side = streams._side_stream(torch.cuda.Stream()).cuda_stream
    assert len(set(kept)) == 4 and not set(kept) & (drawn | {eager_side})
    assert [*capture_and_side(False), *capture_and_side(True)] == kept  # the same ones at every capture


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_capture_on_a_device_that_is_not_current_is_refused():
    """Streams and graphs belong to the current device: the capture says so instead of failing inside CUDA."""
    model = make_model("resnet32", "hdqt").to("cuda:1")
    x, _ = make_batches("resnet32", [8])[0]
    assert torch.cuda.current_device() == 0
    with pytest.raises(ValueError, match="cuda:1 while cuda:0 is the current device"):
        CapturedTraining(model)(x.to("cuda:1"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_sweep_job_on_the_second_gpu_gives_the_first_gpus_results(make_cfg, tmp_path):
    """trainer.device=auto on GPU 1 (as the sweep launcher gives it), graphed, equals the run on GPU 0 made before
    it in the same process (a sweep's worker process runs jobs on whichever GPU has a free slot)."""
    overrides = ["strategy=icarl", "quant=hdqt", "trainer.epochs=2", "trainer.device=auto", "trainer.cuda_graph=true"]
    first = run(make_cfg(*overrides), tmp_path / "gpu0")
    second = run(make_cfg(*overrides), tmp_path / "gpu1", gpu=1)
    torch.cuda.set_device(0)
    assert first["status"] == second["status"] == "complete"
    assert first["acc_matrix"] == second["acc_matrix"] and first["train_loss"] == second["train_loss"]


@pytest.mark.parametrize("scheme", ["hdqt", "int4", "luq", "hot", "mxfp4", "fp32"])
def test_diagnosed_batches_replayed_from_graphs_record_what_eager_ones_record(scheme):
    """diagnostics on a graphed run: the copies' passes and measures replayed from CUDA graphs give the eager
    records bit for bit (dropout masks, BatchNorm, counters, the old and new parts), and are captured again when
    the model grows, a layer is frozen or a mode changes."""
    from hdqt_cil.trainer.diagnostics import GradientDiagnostics, quantizer_steps

    def net(classes):
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                             nn.Dropout(0.3), nn.Linear(8 * 8 * 8, classes))

    torch.manual_seed(0)
    model = quantize_model(net(4), preset(scheme)).cuda().train()
    eager, graphed = GradientDiagnostics(1), GradientDiagnostics(1, graphed=True)
    for plugin in (eager, graphed):
        plugin.experiences = [{"experience": 0, "batches": 0, "layers": {}}]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    captures = []
    for batch in range(7):
        if batch == 4:  # a wider classifier: the model's structure and tensors change
            wider = net(6).cuda()
            wider.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("5.")},
                                  strict=False)
            model = quantize_model(wider, preset(scheme)).train()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if batch == 6:
            model[0].weight.requires_grad_(False)
            model[1].eval()
        x = torch.randn(16, 3, 8, 8, device="cuda")
        steps = quantizer_steps(model)
        logits = model(x)
        loss = F.cross_entropy(logits, torch.randint(0, logits.shape[1], (16,), device="cuda"))
        g = torch.autograd.grad(loss, logits, retain_graph=True)[0]
        old = None if batch < 2 else torch.arange(logits.shape[1], device="cuda") < 2
        strategy = SimpleNamespace(model=model, mb_x=x, clock=SimpleNamespace(train_iterations=batch))
        for plugin in (eager, graphed):
            plugin._record(strategy, steps, g, old)
        graphed._collect()  # a replayed batch's measures come back at the next batch or the epoch's end
        captures.append(graphed._captured)
        np.testing.assert_equal(graphed.experiences, eager.experiences, err_msg=f"batch {batch}")
        logits.backward(g)
        optimizer.step()
        optimizer.zero_grad()
    # captured at batches 0, 2 (old classes), 4 (grown), 6 (frozen, eval); replayed at 1, 3, 5
    assert len({id(c) for c in captures}) == 4 and sum(c.replays for c in set(captures)) == 3
