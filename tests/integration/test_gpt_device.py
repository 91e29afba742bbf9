"""--device of the reference GPT: the placement decision as a pure function of the
flag, the GPUs and the ranks on the node, and the real command line on this machine (nothing
mocked): CPU training with cpu and auto, one line and exit 2 for cuda without enough GPUs."""
from __future__ import annotations

import pytest
import torch

from support.gpt_helpers import launch
from sample_runs.config import ConfigError
from sample_runs.device import choose_placement

TINY = ["--tp", "1", "--pp", "1", "--layers", "2", "--hidden", "32", "--heads", "4",
        "--seq-len", "16", "--steps", "1"]
no_gpu = pytest.mark.skipif(torch.cuda.device_count() > 0, reason="needs a machine without GPUs")


@pytest.mark.parametrize("choice,gpus,ranks,device", [
    ("auto", 0, 1, "cpu"), ("auto", 0, 4, "cpu"),
    ("auto", 4, 4, "cuda"), ("auto", 8, 4, "cuda"), ("auto", 1, 1, "cuda"),
    ("cpu", 8, 4, "cpu"), ("cpu", 0, 1, "cpu"),
    ("cuda", 4, 4, "cuda"), ("cuda", 1, 1, "cuda"),
])
def test_placement(choice, gpus, ranks, device):
    placement = choose_placement(choice, gpus=gpus, local_world_size=ranks)
    assert placement.device_type == device
    assert placement.backend == {"cuda": "nccl", "cpu": "gloo"}[device]
    assert placement.note is None


def test_auto_with_too_few_gpus_falls_back_to_cpu_and_says_why():
    placement = choose_placement("auto", gpus=1, local_world_size=4)
    assert (placement.device_type, placement.backend) == ("cpu", "gloo")
    assert placement.note == ("--device auto: 4 ranks on this node but 1 GPU, so CPU and gloo "
                              "(--device cuda needs one GPU per local rank)")


@pytest.mark.parametrize("gpus,ranks,said", [
    (1, 4, "4 ranks on this node, 1 GPU"), (0, 1, "1 rank on this node, 0 GPUs"),
    (2, 3, "3 ranks on this node, 2 GPUs"),
])
def test_cuda_with_too_few_gpus_is_a_configuration_error(gpus, ranks, said):
    with pytest.raises(ConfigError) as err:
        choose_placement("cuda", gpus=gpus, local_world_size=ranks)
    assert str(err.value) == (f"--device cuda needs one GPU per local rank: {said}; "
                              "run fewer ranks per node or --device cpu")


@no_gpu
def test_cuda_on_this_machine_exits_2_with_one_line():
    proc = launch(1, [*TINY, "--device", "cuda"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("python -m sample_runs.train: error: --device cuda needs one GPU per "
                           "local rank: 1 rank on this node, 0 GPUs; run fewer ranks per node "
                           "or --device cpu\n")


@no_gpu
@pytest.mark.parametrize("choice", ["cpu", "auto"])
def test_cpu_and_auto_train_on_this_machine_without_a_word(choice):
    proc = launch(1, [*TINY, "--device", choice])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("step 1 loss ") and proc.stderr == ""


def test_unknown_device_is_rejected_by_the_parser():
    proc = launch(1, [*TINY, "--device", "tpu"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "invalid choice" in proc.stderr
