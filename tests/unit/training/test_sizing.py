"""Models sized to a time budget (charlm.training.sizing): the rung the rule picks for a budget,
a machine's speed and a data size; the keys the user set winning; `charlm train TEXT --time`
sizing the model and a config or a fine-tune keeping theirs."""

from __future__ import annotations

import pytest
import torch
import yaml

from charlm.cli.train import sized_keys, train_config
from charlm.config.schema import ModelConfig
from charlm.model.gpt import parameter_count
from charlm.training import sizing
from charlm.training.sizing import (
    LADDER,
    PAIR_LADDER,
    TOKENS_PER_PARAMETER,
    TRAIN_SHARE,
    Rung,
    pick,
)
from charlm.training.tasks import task_for
from tests.helpers import ROOT, TINY, pairs_config, reversal_pairs, write_pairs

VOCAB = 65
SHAKESPEARE_TRAIN = 1_003_854  # tiny-shakespeare's training split, in characters


def params(rung: Rung) -> int:
    """What the rule counts: the model's parameters but its bigram table's."""
    m = ModelConfig(**rung.shape())
    return parameter_count(m, VOCAB) - (VOCAB + 1) * VOCAB * m.n_embd


def machine(flops: float):
    """A machine that trains at `flops` (6 per parameter per token): each rung's rate, and
    the rungs asked for."""
    asked: list[Rung] = []

    def rate(rung: Rung) -> float:
        asked.append(rung)
        return flops / (6 * params(rung))

    return rate, asked


@pytest.mark.parametrize(("seconds", "flops", "expected"), [
    (60, 1e10, Rung(2, 96, 4, 64, 16, 3e-3)),      # a minute on a slow CPU: the smallest
    (300, 1e11, LADDER[2]),                          # 5 minutes, a fast CPU: 4 x 128
    (1800, 1e11, LADDER[3]),                         # 30 minutes on it: 4 x 192
    (600, 1e15, LADDER[-1]),                         # a GPU: the ladder's top
])
def test_the_rung_is_the_largest_whose_tokens_reach_the_rule(seconds, flops, expected):
    rate, asked = machine(flops)
    chosen = pick(seconds, rate, SHAKESPEARE_TRAIN, params)
    assert chosen.rung == expected
    tokens = flops / (6 * params(expected)) * TRAIN_SHARE * seconds
    assert chosen.tokens == pytest.approx(tokens)
    assert chosen.params == params(expected)
    assert chosen.epochs == pytest.approx(tokens / SHAKESPEARE_TRAIN)
    i = LADDER.index(expected)
    assert asked == list(LADDER[:i + 2])  # the speeds measured: up to the first rung refused
    if expected != LADDER[0]:
        assert tokens >= TOKENS_PER_PARAMETER * params(expected)
    if expected != LADDER[-1]:
        following = flops / (6 * params(LADDER[i + 1])) * TRAIN_SHARE * seconds
        assert following < TOKENS_PER_PARAMETER * params(LADDER[i + 1])
        assert chosen.next_ratio == pytest.approx(following / params(LADDER[i + 1]))
    else:
        assert chosen.next_ratio is None


def test_a_longer_budget_or_a_faster_machine_never_picks_a_smaller_model():
    budgets, machines = (60, 300, 900, 1800), (1e10, 1e11, 1e12)
    picked = [[LADDER.index(pick(s, machine(f)[0], SHAKESPEARE_TRAIN, params).rung)
               for s in budgets] for f in machines]
    assert all(row == sorted(row) for row in picked)
    assert all(list(column) == sorted(column) for column in zip(*picked, strict=True))
    assert picked[0][0] == 0 and picked[-1][-1] > picked[0][-1]


@pytest.mark.parametrize(("epochs", "dropout"), [
    (0.5, 0.0), (15.9, 0.0),  # a text read under 16 times: dropout would cost more than it gains
    (16.0, 0.1), (31.0, 0.1), (32.0, 0.2), (5000.0, 0.2),  # read ever more often: more of it
])
def test_dropout_rises_with_the_epochs_of_the_training_text(epochs, dropout):
    rate, _ = machine(1e11)
    tokens = pick(300, rate, SHAKESPEARE_TRAIN, params).tokens
    chosen = pick(300, rate, int(tokens / epochs), params)  # the same rung, another text size
    assert chosen.rung == LADDER[2]
    assert chosen.epochs >= epochs and chosen.epochs == pytest.approx(epochs, rel=1e-3)
    assert chosen.dropout == dropout


def test_the_block_fits_the_data_splits():
    rate, _ = machine(1e11)
    chosen = pick(1800, rate, SHAKESPEARE_TRAIN, params, room=100)
    assert chosen.rung == LADDER[3] and chosen.block_size == 100  # its own block is 128
    assert chosen.keys(set(), chosen.rung.lr)["model.block_size"] == 100


def test_the_keys_the_user_set_are_left_out_and_min_lr_follows_the_users_lr():
    chosen = pick(300, machine(1e11)[0], SHAKESPEARE_TRAIN, params)
    keys = chosen.keys({"model.n_layer", "optim.lr", "data.path"}, lr=1e-3)
    assert keys == {"model.n_embd": 128, "model.n_head": 4, "model.block_size": 64,
                    "model.dropout": chosen.dropout, "model.pos_encoding": "rope",
                    "model.activation": "relu2", "model.logit_softcap": 15.0,
                    "model.bigram": True, "optim.min_lr": 1e-4,
                    "optim.weight_decay": 0.5, "optim.embedding_weight_decay": 0.0,
                    "optim.ema": 0.99, "train.batch_size": 16}


def test_the_line_says_what_was_picked_and_why():
    chosen = pick(300, lambda rung: 1e11 / (6 * params(rung)), SHAKESPEARE_TRAIN, params)
    rate = 1e11 / (6 * params(LADDER[2]))
    assert chosen.line(300) == (
        f"model sized to 5m00s: 4 x 128 (layers x width), block 64, "
        f"{params(LADDER[2]) / 1e6:.2f}M parameters, dropout {chosen.dropout:g}: at "
        f"{rate:,.0f} tok/s measured here it trains on {chosen.tokens / 1e6:.1f}M tokens, "
        f"{chosen.tokens / chosen.params:.1f} tokens a parameter, {chosen.epochs:.1f} epochs of "
        f"the training text; the next size up would get {chosen.next_ratio:.1f} a parameter, "
        f"the rule wants {TOKENS_PER_PARAMETER:g} (a config or --set overrides)")


def test_measure_rate_times_real_steps_and_leaves_the_random_streams_alone(tiny_cfg, tmp_path):
    task = task_for(tiny_cfg, tmp_path / "cache")
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    assert sizing.measure_rate(task, torch.device("cpu"), torch.float32) > 0
    assert torch.equal(torch.rand(3), expected)


def test_only_a_fresh_run_of_the_defaults_with_a_budget_is_sized(tmp_path, corpus):
    given = [("model.n_layer", 3), ("train.out_dir", str(tmp_path / "r"))]
    cfg = train_config([str(corpus)], given, budget="5m")[0]
    assert sized_keys([str(corpus)], given, cfg) == {"model.n_layer", "train.out_dir"}
    assert sized_keys([str(corpus)], given, train_config([str(corpus)], given)[0]) is None
    with_config = [str(TINY), str(corpus)]
    assert sized_keys(with_config, given, train_config(with_config, given, budget="5m")[0]) is None


def test_pairs_are_sized_on_the_encoder_decoder_ladder_with_the_block_they_need():
    asked = []

    def count(rung: Rung) -> int:  # any count: the rule reads it
        return parameter_count(ModelConfig(**rung.shape(34)), VOCAB)

    def rate(rung: Rung) -> float:
        asked.append(rung)
        return 1e11 / (6 * count(rung))

    chosen = pick(1800, rate, 2_000_000, count, room=34, ladder=PAIR_LADDER)
    assert chosen.rung in PAIR_LADDER[1:] and asked[0] == PAIR_LADDER[0]
    assert chosen.block_size == 34
    keys = chosen.keys({"model.arch"}, chosen.rung.lr)
    r = chosen.rung
    assert keys == {"model.n_layer": r.n_layer, "model.n_embd": r.n_embd,
                    "model.n_head": r.n_head, "model.block_size": 34,
                    "model.pos_encoding": "sinusoidal", "model.label_smoothing": 0.1,
                    "model.activation": "relu2", "model.logit_softcap": 15.0,
                    "model.dropout": chosen.dropout, "optim.lr": r.lr,
                    "optim.min_lr": r.lr / 10, "train.batch_size": 128,
                    "optim.weight_decay": 0.01, "optim.warmup_iters": 300, "optim.ema": 0.99,
                    "train.eval_interval": 1000, "train.eval_iters": 10}
    assert f"{r.n_layer} + {r.n_layer} x {r.n_embd} (encoder + decoder layers x width), " \
        "block 34, " in chosen.line(1800)
    assert "epochs of the training pairs" in chosen.line(1800)


def test_the_pair_ladders_second_rung_is_the_g2p_preset():
    """The sized encoder-decoder trains the G2P preset's recipe: a lever taken into one is
    taken into the other."""
    preset = yaml.safe_load((ROOT / "configs" / "g2p_cmudict.yaml").read_text())
    keys = sizing.rung_keys(PAIR_LADDER[1], preset["model"]["block_size"])
    assert keys == {k: preset[k.split(".")[0]][k.split(".")[1]] for k in keys}


def test_a_pairs_task_measures_its_data_for_the_rule(tmp_path):
    pairs = reversal_pairs(60, 1)
    data = write_pairs(tmp_path / "reverse.tsv", pairs)
    task = task_for(pairs_config(data, tmp_path / "run"), tmp_path / "cache")
    longest = max(max(len(s) for s, _ in pairs), max(len(t.split()) for _, t in pairs) + 1)
    assert task.room() == longest  # a target also takes its begin id
    train = task.data.train
    assert task.train_tokens() == len(train.src) + len(train.tgt) + len(train)  # begin ids
    src, tgt_in, targets = task.random_batch(5, torch.device("cpu"))
    mean = [len(train.src) / len(train), len(train.tgt) / len(train)]
    assert src.shape == (5, round(mean[0])) and tgt_in.shape == (5, round(mean[1]) + 1)
    assert targets is tgt_in and int(src.max()) < task.vocab.source_size
