"""The memory guard in runs: estimates of what a batch needs (`charlm.model.footprint`) checked
against the device before the first allocation, in training, scoring and loading; and
`--overwrite`, which removes the previous run only once the new one has run its first step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from charlm.cli.app import Interrupt
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.training import checkpoint
from charlm.training import loop as train_module
from charlm.training.loop import train
from charlm.training.run_dir import RUN_FILES
from tests.helpers import (
    TINY,
    fixed_memory,
    no_step,
    pairs_config,
    reversal_pairs,
    with_,
    write_pairs,
)


def short(cfg: RunConfig) -> RunConfig:
    return with_(cfg, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                             "sample_chars": 0})


def test_a_normal_run_trains_on_an_8_gib_machine(tiny_cfg, monkeypatch):
    fixed_memory(monkeypatch, 8)
    assert train(short(tiny_cfg)).step == 2


def test_an_encoder_decoder_batch_is_guarded_by_its_pairs_shapes(tmp_path, monkeypatch):
    """The guard sizes an encoder-decoder's batch as its sampler draws it: at most as many pairs
    as the split holds, sources and targets of up to block_size."""
    data = write_pairs(tmp_path / "reverse.tsv", reversal_pairs(400, 0))
    cfg = with_(pairs_config(data, tmp_path / "run"), train={"batch_size": 10**8})
    fixed_memory(monkeypatch, 0.01)
    no_step(monkeypatch)
    with pytest.raises(CharlmError) as e:
        train(cfg)
    rows = int(str(e.value).split()[3].replace(",", ""))
    assert 200 < rows < 400  # the train split's pairs, not 10**8
    assert str(e.value).startswith(f"a batch of {rows:,} x 16 needs about 0.0")  # ~13 MiB
    assert "more than the 0.0 GiB of cpu" in str(e.value)


def files_of(run: Path) -> dict[str, bytes]:
    """Every file of a run dir but its dataset cache, by path, with its bytes."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
            if p.is_file() and "dataset" not in p.relative_to(run).parts}


def test_overwrite_keeps_the_previous_run_until_the_new_one_has_stepped(
        cli, monkeypatch, tmp_path, corpus):
    """`--overwrite` deleted the previous run before the new one had shown it could start: a
    batch too big, a failure at the first step or Ctrl-C before it left neither run. Now the
    previous run's files stay byte for byte until the new run's first step is done."""
    run = tmp_path / "run"
    common = ["train", TINY, "--data", corpus, "--out", run, "--set", "train.eval_interval=2",
              "--set", "train.eval_iters=1", "--set", "train.sample_chars=0"]
    assert cli(*common, "--set", "train.max_iters=2").code == 0
    before = files_of(run)
    assert {"config.yaml", "metrics.jsonl", "last.pt", "best.pt"} <= set(before)
    assert any(name.startswith("tb/") for name in before)
    with monkeypatch.context() as patch:
        fixed_memory(patch, 24)
        no_step(patch)
        result = cli(*common, "--overwrite", "--set", "train.batch_size=100000000")
    assert result.code == 2 and result.err.startswith("error: a batch of 100,000,000 x 16 ")
    assert files_of(run) == before

    def out_of_memory(*args, **kwargs):  # the allocator's failure at the first step
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1")

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "train_step", out_of_memory)
        result = cli(*common, "--overwrite")
    assert result.code == 2 and result.err.startswith("error: out of memory")
    assert files_of(run) == before

    def ctrl_c(*args, **kwargs):  # before the first step (here: while compiling)
        raise Interrupt

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "wrap_model", ctrl_c)
        assert cli(*common, "--overwrite").code == 130
    assert files_of(run) == before
    assert cli(*common, "--overwrite", "--set", "train.max_iters=4").code == 0  # replaced
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 4
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()]
    assert steps == [2, 4, 4]  # the new run's evals and its last train event only


def test_a_fresh_run_that_fails_at_its_first_step_writes_nothing(tiny_cfg, monkeypatch):
    """Its config.yaml and logs would have made the next `charlm train` ask for --overwrite."""
    no_step(monkeypatch)
    with pytest.raises(AssertionError):
        train(short(tiny_cfg))
    run = Path(tiny_cfg.train.out_dir)
    assert not [name for name in RUN_FILES if (run / name).exists()]
    monkeypatch.undo()
    assert train(short(tiny_cfg)).step == 2  # no --overwrite needed


def test_a_checkpoint_larger_than_memory_is_refused_before_it_is_read(run_dir, monkeypatch):
    size = (run_dir / "last.pt").stat().st_size
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: size - 1)
    with pytest.raises(CharlmError, match=f"^checkpoint {run_dir / 'last.pt'} holds 0.0 GiB, "
                       "more than the 0.0 GiB of cpu; load it on a machine with more memory$"):
        checkpoint.load(run_dir / "last.pt")
    # the file fits, the model's weights on the device do not
    answers = iter([2**40, 1])
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: next(answers))
    with pytest.raises(CharlmError, match="needs 0.0 GiB for its weights, more than"):
        checkpoint.load_model(run_dir / "last.pt")


def test_eval_needs_the_same_memory_whatever_the_length_of_the_text(cli, run_dir, tmp_path,
                                                                    monkeypatch):
    """`charlm eval` held the whole text, its ids and a plan of its windows (about 31 bytes a
    character), so a long text was refused on a small machine, or ran it out of memory.
    Streamed, it needs a forward of 32 windows and one chunk's ids, whatever the length: a
    1,900,000-character text is scored where 0.1 GiB is free, and only a machine too small
    for that forward is refused."""
    text = tmp_path / "long.txt"
    text.write_text("to be or not to be\n" * 100_000, encoding="utf-8")  # 1,900,000 characters
    fixed_memory(monkeypatch, 0.1)

    def count(model, windows):  # the windows, not their forwards: the test is the memory check
        n = sum(len(row) - 1 - offset for row, offset in windows)
        return 0.5 * n, n

    with monkeypatch.context() as patch:
        patch.setattr("charlm.evaluation.scoring.score_windows", count)
        result = cli("eval", run_dir, text)
    assert (result.code, result.err) == (0, "")
    assert result.out == ("loss 0.5000 nats/char, 0.7213 bits/char, perplexity 1.649, "
                          "1,899,999 characters scored\n")
    fixed_memory(monkeypatch, 0.001)
    result = cli("eval", run_dir, text)
    assert (result.code, result.out, result.err) == (2, "", (
        "error: scoring needs about 0.0 GiB for a forward of 32 windows of 16, more than the "
        "0.0 GiB of cpu; free memory on the device, or score on another --device\n"))
