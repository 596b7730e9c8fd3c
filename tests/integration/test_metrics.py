"""TensorBoard tells the run's story: scalars at the log and eval steps, a text sample at each
eval, and the hyperparameters with the final metrics, read back with tensorboard's reader."""

import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from charlm.generation.text import preview
from charlm.training import checkpoint
from charlm.training.loop import train
from charlm.training.metrics import flatten
from tests.helpers import ROOT, with_


def read_tb(run: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_scalars_sample_and_hparams(tiny_cfg):
    cfg = with_(tiny_cfg, train={"max_iters": 6, "log_interval": 2, "eval_interval": 3,
                                 "eval_iters": 1, "sample_chars": 30})
    state = train(cfg)
    run = Path(cfg.train.out_dir)
    acc = read_tb(run)

    def steps(tag: str) -> list[int]:
        return [e.step for e in acc.Scalars(tag)]

    for tag in ("train/loss", "lr", "grad_norm", "tokens_per_s", "train/skipped_steps"):
        assert steps(tag) == [2, 4, 6], tag
    for tag in ("val/loss", "val/bpc", "train/eval_loss"):
        assert steps(tag) == [3, 6], tag
    val = [e.value for e in acc.Scalars("val/loss")]
    bpc = [e.value for e in acc.Scalars("val/bpc")]
    assert bpc == pytest.approx([v / math.log(2) for v in val])
    assert [e.value for e in acc.Scalars("train/skipped_steps")] == [0, 0, 0]

    samples = acc.Tensors("sample/text_summary")
    assert [e.step for e in samples] == [3, 6]
    texts = [e.tensor_proto.string_val[0].decode() for e in samples]
    assert all(line.startswith("    ") for t in texts for line in t.splitlines())  # code block
    # The last sample is the final model's, from its own seeded generator: reproducible.
    model, vocab, _, _ = checkpoint.load_model(run)
    expected = preview(model, vocab, 30, cfg.train.seed)
    assert len(expected) == 31 and expected[0] == "\n"
    assert texts[-1] == "".join(f"    {line}\n" for line in expected.split("\n"))

    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    hparams = {k: v.ListFields()[0][1] for k, v in start.hparams.items()}
    assert hparams == flatten(cfg.to_dict()) | {"train.threads": float(torch.get_num_threads())}
    assert hparams["train.max_iters"] == 6 and hparams["model.n_layer"] == 2
    assert hparams["optim.lr_decay_iters"] == "None"
    final = {tag: [(e.step, e.value) for e in acc.Scalars(f"hparams/{tag}")]
             for tag in ("best_val_loss", "final_val_loss", "final_val_bpc")}
    assert final["best_val_loss"] == [(6, pytest.approx(state.best_val))]
    assert final["final_val_loss"] == [(6, pytest.approx(val[-1]))]
    assert final["final_val_bpc"] == [(6, pytest.approx(bpc[-1]))]


def test_sample_chars_zero_writes_no_sample(tiny_cfg):
    cfg = with_(tiny_cfg, train={"max_iters": 2, "eval_interval": 1, "eval_iters": 1,
                                 "sample_chars": 0})
    train(cfg)
    acc = read_tb(Path(cfg.train.out_dir))
    assert acc.Tags()["tensors"] == []
    assert [e.step for e in acc.Scalars("val/loss")] == [1, 2]


def test_resume_after_a_crash_logs_each_step_once(tiny_cfg):
    """A run killed after its last checkpoint (step 10) had logged steps 12 and 14 and half a
    line: the resume cuts metrics.jsonl and TensorBoard back to step 10 and logs 12 and 14
    again, so every step appears once, with the resumed run's values. The crashed run's event
    file is named as one of the next second would be, after any the resume could open now:
    the resume waits, so that TensorBoard reads its file (and its purge) last."""
    import json
    import time

    from torch.utils.tensorboard import SummaryWriter

    cfg = with_(tiny_cfg, train={"max_iters": 10, "log_interval": 2, "eval_interval": 5,
                                 "eval_iters": 1, "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:  # what the crash left
        for step in (12, 14):
            f.write(json.dumps({"event": "train", "step": step, "train_loss": 99.0}) + "\n")
        f.write('{"event": "train", "st')
    before = set((run / "tb").iterdir())
    crashed = SummaryWriter(str(run / "tb"))
    for step in (12, 14):
        crashed.add_scalar("train/loss", 99.0, step)
    crashed.close()
    [crashed_file] = set((run / "tb").iterdir()) - before
    crashed_file = crashed_file.rename(
        run / "tb" / f"events.out.tfevents.{int(time.time()) + 1:010d}.~.0.0")

    train(with_(cfg, train={"max_iters": 14}), resume=True)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [e["step"] for e in events if e["event"] == "train"]
    assert train_steps == [2, 4, 6, 8, 10, 12, 14]
    assert all(e.get("train_loss") != 99.0 for e in events)
    loss = read_tb(run).Scalars("train/loss")
    assert [e.step for e in loss] == [2, 4, 6, 8, 10, 12, 14]
    assert all(e.value != 99.0 for e in loss)
    assert max((run / "tb").iterdir()).name > crashed_file.name


def test_a_full_disk_while_logging_is_one_error_line_and_the_run_resumes(cli, tmp_path, corpus,
                                                                          monkeypatch):
    """metrics.jsonl cannot be written (ENOSPC at its 4th line, step 30 of tiny.yaml): one
    error line naming the file, exit 2, not a second error from closing it; --resume then goes
    on from last.pt (step 20) and logs every step once."""
    import errno
    import json

    from charlm.training import metrics

    class FullDisk:
        def __init__(self, f):
            self.f, self.name, self.lines = f, f.name, 0

        def write(self, text):
            self.lines += 1
            if self.lines == 4:
                self.failed = True
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(text)

        def flush(self):
            self.f.flush()

        def close(self):
            self.f.close()
            if getattr(self, "failed", False):  # as a real file would, with data left unwritten
                raise OSError(errno.ENOSPC, "No space left on device")

    real_init = metrics.MetricsLogger.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.jsonl = FullDisk(self.jsonl)

    run = tmp_path / "run"
    args = ("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run)
    with monkeypatch.context() as m:
        m.setattr(metrics.MetricsLogger, "__init__", init)
        result = cli(*args)
    assert (result.code, result.err) == (2, f"error: cannot write {run / 'metrics.jsonl'}: No "
                                         "space left on device; free disk space (or fix the run "
                                         "dir), then continue with --resume\n")
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 20
    assert cli(*args, "--resume").code == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "train"]
    assert steps == [10, 20, 30, 40, 50, 60]
