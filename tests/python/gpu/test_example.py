"""examples/torch_moe: a few training steps with expert parallelism give
the losses of the same model without it."""
import os
import sys

from common import BACKEND, ENV, ROOT


def test_example_losses_match_the_reference_model():
    sys.path.insert(0, os.path.join(ROOT, "examples", "torch_moe"))
    import train
    losses, losses_ref = train.train(ENV.group, ENV.device, steps=4, backend=BACKEND)
    assert losses[-1] < losses[0], "training should lower the loss"
    for step, (a, b) in enumerate(zip(losses, losses_ref)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: loss {a} with expert parallelism, {b} without"
