"""Impossible configurations of the reference GPT fail before any process group exists:
one line on stderr, exit code 2, no traceback."""
from __future__ import annotations

import pytest

from sample_runs.train import DEFAULT_WORLD_SIZE, main

IMPOSSIBLE = [
    # (world size, flags, words the message must contain)
    (4, ["--tp", "3", "--pp", "1"], "world size 4"),
    (4, ["--tp", "2", "--pp", "2", "--dp", "2"], "world size 4 != tp 2 x dp 2 x pp 2"),
    (2, ["--tp", "1", "--pp", "2", "--layers", "3"], "--layers 3"),
    (4, ["--tp", "1", "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2",
         "--layers", "6"], "--layers 6"),
    (2, ["--tp", "2", "--pp", "1", "--heads", "3", "--hidden", "48"], "--heads 3"),
    (2, ["--tp", "2", "--pp", "1", "--vocab", "257"], "--vocab 257"),
    (4, ["--tp", "4", "--pp", "1", "--hidden", "66", "--heads", "4"], "--hidden 66"),
    (2, ["--tp", "2", "--pp", "1", "--sp", "--seq-len", "15"], "--seq-len"),
    (2, ["--tp", "1", "--pp", "2", "--schedule", "interleaved"], "--virtual-stages >= 2"),
    (2, ["--tp", "1", "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2",
         "--microbatches", "3"], "divisible by --pp"),
    (2, ["--tp", "1", "--pp", "2", "--virtual-stages", "2"], "needs --schedule interleaved"),
    (1, ["--tp", "1", "--pp", "1", "--vocab", "100"], "--vocab must be >= 256"),
    (1, [], "run under torchrun"),
    (1, ["--tp", "1", "--pp", "1", "--microbatches", "0"], "--microbatches must be >= 1"),
    (1, ["--tp", "1", "--pp", "1", "--schedule", "pipedream"], "invalid choice"),
]


@pytest.mark.parametrize("world,flags,words", IMPOSSIBLE)
def test_impossible_configuration_exits_2_with_one_line(world, flags, words, monkeypatch, capsys):
    if world > 1:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(world))
    else:
        monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert words in err and "Traceback" not in err


def test_default_world_size_fits_default_flags():
    from sample_runs.config import parse_config

    cfg = parse_config([], world_size=DEFAULT_WORLD_SIZE)
    assert (cfg.tp, cfg.sp, cfg.pp, cfg.dp, cfg.schedule, cfg.microbatches) == \
        (2, True, 2, 1, "1f1b", 4)
