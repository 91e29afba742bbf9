"""Every parallel layout of the reference GPT computes the single-process numbers: the first
three losses within 1e-5 relative, and the step-1 gradients of every parameter once gathered
to full tensors. Real multi-process gloo runs on CPU."""
from __future__ import annotations

import numpy as np
import pytest

from support.gpt_helpers import runs_in_background

# (name, ranks, flags); DP layouts halve the micro-batches per rank so that the global batch
# (d * m * b windows) equals the reference's m = 4.
LAYOUTS = [
    ("tp2", 2, ["--tp", "2", "--no-sp", "--pp", "1", "--microbatches", "4"]),
    ("tp2-sp", 2, ["--tp", "2", "--sp", "--pp", "1", "--microbatches", "4"]),
    ("dp2", 2, ["--tp", "1", "--pp", "1", "--microbatches", "2"]),
    ("pp2-gpipe", 2, ["--tp", "1", "--pp", "2", "--schedule", "gpipe", "--microbatches", "4"]),
    ("pp2-1f1b", 2, ["--tp", "1", "--pp", "2", "--schedule", "1f1b", "--microbatches", "4"]),
    ("pp2-zb-h1", 2, ["--tp", "1", "--pp", "2", "--schedule", "zb-h1", "--microbatches", "4"]),
    ("pp2-interleaved-v2", 2, ["--tp", "1", "--pp", "2", "--schedule", "interleaved",
                               "--virtual-stages", "2", "--microbatches", "4"]),
    ("tp2xpp2", 4, ["--tp", "2", "--no-sp", "--pp", "2", "--microbatches", "4"]),
    ("tp2-sp-x-dp2", 4, ["--tp", "2", "--sp", "--pp", "1", "--microbatches", "2"]),
    ("tp2-sp-x-pp2-zb-h1", 4, ["--tp", "2", "--sp", "--pp", "2", "--schedule", "zb-h1",
                               "--microbatches", "4"]),
    ("dp2xpp2-zb-h1", 4, ["--tp", "1", "--pp", "2", "--dp", "2", "--schedule", "zb-h1",
                          "--microbatches", "2"]),
]


REFERENCE = ("single", 1, ["--tp", "1", "--pp", "1", "--microbatches", "4"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All runs: one launch per world size (most of a launch is process start-up), two
    launches at a time; each test waits for its own."""
    yield from runs_in_background(tmp_path_factory.mktemp("layouts"), [REFERENCE, *LAYOUTS])


@pytest.fixture(scope="module")
def reference(runs):
    return runs["single"].result()


@pytest.mark.parametrize("name,ranks,flags", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_layout_matches_single_process(name, ranks, flags, runs, reference):
    run = runs[name].result()
    assert len(run["losses"]) == 3
    np.testing.assert_allclose(run["losses"], reference["losses"], rtol=1e-5)
    assert run["stdout"].splitlines() == [f"step {i + 1} loss {x:.6f}"
                                          for i, x in enumerate(run["losses"])]
    assert run["grads"].keys() == reference["grads"].keys()
    for key, ref in reference["grads"].items():
        got = run["grads"][key]
        assert got.shape == ref.shape, key
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * scale, err_msg=key)


def test_loss_falls(reference):
    losses = reference["losses"]
    assert losses[2] < losses[0]
