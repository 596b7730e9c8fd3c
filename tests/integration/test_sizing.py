"""`charlm train TEXT --time` sizing the model to the budget (charlm.training.sizing) and a
config keeping its own: each trains for its budget of seconds, so they live here rather than
beside the sizing rule's tests in tests/unit/training/test_sizing.py."""

from __future__ import annotations

import yaml

from charlm.training import sizing
from charlm.training.sizing import LADDER, PAIR_LADDER
from tests.helpers import TINY, reversal_pairs, write_pairs


def test_train_with_a_budget_runs_the_picked_model_and_says_so(cli, tmp_path, corpus,
                                                               monkeypatch):
    speeds = {LADDER[0]: 1e6, LADDER[1]: 1e6, LADDER[2]: 10.0}  # rung 2 gets too few tokens
    monkeypatch.setattr(sizing, "measure_rate",
                        lambda task, device, dtype: speeds[next(
                            r for r in LADDER if (r.n_layer, r.n_embd) ==
                            (task.cfg.model.n_layer, task.cfg.model.n_embd))])
    r = cli("train", corpus, "--time", "3s", "--out", tmp_path / "run",
            "--set", "model.n_head=2", "--set", "train.eval_interval=5")
    assert r.code == 0, r.err
    # 36,000 chars, 70 epochs; the rule leaves the bigram table of (V + 1) x V x 128 out
    assert "model sized to 3.0s: 2 x 128 (layers x width), block 64, 0.40M parameters and a " \
        "0.44M bigram table, dropout 0.2: at 1,000,000 tok/s measured here" in r.out
    assert "(a config or --set overrides); the keys you set win: model.n_head\n" in r.out
    # each rung as it is timed (a 24h budget timed the ladder for minutes in silence)
    assert [line for line in r.out.splitlines() if line.startswith("sizing ")] == [
        f"sizing the model to 3.0s: timing {rung} ... {speed}" for rung, speed in
        zip(LADDER, ("1,000,000 tok/s", "1,000,000 tok/s", "10 tok/s"), strict=False)]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert {k: saved["model"][k] for k in ("n_layer", "n_embd", "n_head", "block_size",
                                           "pos_encoding", "activation")} == {
        "n_layer": 2, "n_embd": 128, "n_head": 2, "block_size": 64, "pos_encoding": "rope",
        "activation": "relu2"}  # the pick, but the n_head the user set
    assert saved["model"]["dropout"] == 0.2
    assert (saved["optim"]["lr"], saved["train"]["batch_size"]) == (4.5e-3, 16)


def test_train_with_a_config_and_a_budget_keeps_the_configs_model(cli, tmp_path, corpus,
                                                                  monkeypatch):
    def refuse(*args):
        raise AssertionError("a config's model was sized")

    monkeypatch.setattr(sizing, "measure_rate", refuse)
    r = cli("train", TINY, corpus, "--time", "2s", "--out", tmp_path / "run")
    assert r.code == 0, r.err
    assert "model sized" not in r.out
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    tiny = yaml.safe_load(TINY.read_text())
    assert {k: saved["model"][k] for k in tiny["model"]} == tiny["model"]


def test_train_pairs_with_a_budget_sizes_an_encoder_decoder(cli, tmp_path, monkeypatch):
    data = write_pairs(tmp_path / "reverse.tsv", reversal_pairs(300, 2))
    speeds = {PAIR_LADDER[0]: 1e6, PAIR_LADDER[1]: 10.0}  # rung 1 gets too few tokens
    seen = []

    def rate(task, device, dtype):
        seen.append(task.cfg.model)
        return speeds[next(r for r in PAIR_LADDER if (r.n_layer, r.n_embd) ==
                           (task.cfg.model.n_layer, task.cfg.model.n_embd))]

    monkeypatch.setattr(sizing, "measure_rate", rate)
    r = cli("train", data, "--time", "3s", "--out", tmp_path / "run",
            "--set", "model.arch=encoder_decoder", "--set", "data.target_units=space",
            "--set", "train.eval_interval=5", "--set", "train.eval_pairs=4")
    assert r.code == 0, r.err
    room = max(max(len(s) for s, _ in reversal_pairs(300, 2)), 6 + 1)
    assert f"model sized to 3.0s: 2 + 2 x 96 (encoder + decoder layers x width), block " \
        f"{room}, " in r.out
    assert seen[0].arch == "encoder_decoder" and seen[0].block_size == room
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert {k: saved["model"][k] for k in ("arch", "n_layer", "n_embd", "n_head",
                                           "block_size", "pos_encoding",
                                           "label_smoothing")} == {
        "arch": "encoder_decoder", "n_layer": 2, "n_embd": 96, "n_head": 4,
        "block_size": room, "pos_encoding": "sinusoidal", "label_smoothing": 0.1}
    assert (saved["optim"]["lr"], saved["train"]["batch_size"]) == (3e-3, 128)
