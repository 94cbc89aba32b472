"""A quantized layer's backward as two branches: the weight gradient on a second stream beside the input gradient.

Each gradient is a chain of small kernels (its operands' quantizers, im2col columns, the product), so a layer's
backward alone on a GPU is bound by the chain's length, not by its work (docs/kernels.md, "The training step: CUDA
graphs"; processes sharing a GPU pay the work instead, and there the branches gain nothing). The two chains read
the same saved tensors and write nothing the other reads; the weight gradient's runs on a side stream forked from
the current one and joins it before the layer's backward returns, so a CUDA graph captures them as parallel
branches and runs them side by side. The same kernels on the same inputs give the same bits; their shared counters
(saturated tile sums, the largest scale) are atomic sums and maxima, whose results do not depend on the order.
"""
import torch

# Whether CUDA backwards run the two branches on two streams (scripts/bench/kernels.py times both ways).
PARALLEL = True
# The streams that graphs are captured on, and their branches' side streams (graph_replay.capturing_into): torch's
# high priority pool, from which eager work never draws a stream.
CAPTURE_PRIORITY = -1

_side_streams: dict[int, torch.cuda.Stream] = {}


def _side_stream(current: torch.cuda.Stream) -> torch.cuda.Stream:
    """One side stream per current stream: a backward on another stream (a diagnosis beside the training steps,
    a warm-up) forks onto its own, so that neither waits for the other. A capture stream's comes from the capture
    streams' pool: each graph's branch then keeps a cuBLAS workspace (one a stream) that no other graph's replay
    and no eager work uses."""
    side = _side_streams.get(current.cuda_stream)
    if side is None:
        priority = CAPTURE_PRIORITY if torch.cuda.is_current_stream_capturing() else 0
        side = _side_streams[current.cuda_stream] = torch.cuda.Stream(current.device, priority=priority)
    return side


def layer_gradients(grad_input, grad_weight, device: torch.device, need_input: bool, need_weight: bool):
    """(grad_input() or None, grad_weight() or None), each called where its gradient is needed; on CUDA with both
    needed, grad_weight's launches go to a side stream forked before grad_input's, and the current stream waits for
    them before this returns."""
    if not (PARALLEL and need_input and need_weight and device.type == "cuda"):
        return (grad_input() if need_input else None), (grad_weight() if need_weight else None)
    current = torch.cuda.current_stream(device)
    side = _side_stream(current)
    side.wait_stream(current)
    grad_x = grad_input()
    with torch.cuda.stream(side):
        grad_w = grad_weight()
    current.wait_stream(side)
    grad_w.record_stream(current)  # made on the side stream, used and freed on the current one
    return grad_x, grad_w
