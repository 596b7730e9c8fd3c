"""charlm.training.metrics: config keys flattened for TensorBoard's hparams."""

from charlm.training.metrics import flatten


def test_flatten_names_keys_by_section():
    assert flatten({"model": {"n_layer": 2, "bias": False}, "train": {"every": None,
                                                                      "seq": (1, 2)}}) == {
        "model.n_layer": 2, "model.bias": False, "train.every": "None", "train.seq": "(1, 2)"}


def test_without_a_progress_bar_a_line_every_so_often_with_the_rate_and_time_left(
        tmp_path, capsys):
    """Off a terminal (nohup, CI) the bar is off: a progress line at a log step PROGRESS_S after
    the last line, with the training rate and the budget's time left; eval lines say them too."""
    from charlm.training.metrics import PROGRESS_S, MetricsLogger

    clock = [100.0]
    log = MetricsLogger(tmp_path, 50, progress=False)
    log.set_deadline(400.0, lambda: clock[0])
    log.said = clock[0]
    train = {"step": 10, "train_loss": 2.5, "lr": 1e-3, "tokens_per_s": 12345.6,
             "grad_norm": 1.0, "skipped_steps": 0, "elapsed_s": 1.0, "tokens": 1}
    log.log("train", **train)
    clock[0] += PROGRESS_S
    log.log("train", **{**train, "step": 20})
    clock[0] += 1
    log.log("train", **{**train, "step": 30})  # too soon after the last line
    log.close()
    assert capsys.readouterr().out == "step 20/50: train 2.5000, 12,346 tok/s, 4m30s left\n"
    assert log.status() == ", 12,346 tok/s, 4m29s left"
