"""charlm tune: the search space and its errors, one trial's child process and how it ends, and
whole studies run as a user would (crash, divergence, Ctrl-C and --resume, two workers on the
journal file and on PostgreSQL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from charlm.config.loading import load_config
from charlm.core.errors import CharlmError
from charlm.tune.space import check_space, read_search
from charlm.tune.trial import Follower, Stop, run_trial
from tests.helpers import TINY, write

optuna = pytest.importorskip("optuna")

# Trials of a few seconds: a small eval and no samples; one thread each (two cores, two workers).
QUICK = ["--set", "train.eval_interval=5", "--set", "train.eval_iters=2", "--set",
         "train.sample_chars=0", "--set", "train.log_interval=5"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def search_of(tmp_path: Path, text: str) -> list[str]:
    return [str(write(tmp_path / "search.yaml", text))]


# --- the search space ---------------------------------------------------------------------


def test_search_file_and_options_give_params_and_settings(tmp_path: Path) -> None:
    items = search_of(tmp_path, "optim.lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"
                                "model.activation: [gelu, swiglu]\n"
                                "optim.min_lr: {of: optim.lr, times: 0.1}\n"
                                "trials: 7\nsampler: random\ntimeout: 5m\n")
    search = read_search([*items, "model.n_layer={type: int, low: 2, high: 6, step: 2}"])
    assert search.spec() == {
        "optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        "model.activation": {"type": "categorical", "choices": ["gelu", "swiglu"]},
        "optim.min_lr": {"of": "optim.lr", "times": 0.1},
        "model.n_layer": {"type": "int", "low": 2, "high": 6, "step": 2},
    }
    assert search.settings == {"trials": 7, "sampler": "random", "timeout": 300.0}
    assert search.params["model.n_layer"].grid() == [2, 4, 6]
    base = load_config(TINY).to_dict()
    cfg = search.trial_config(base, {"optim.lr": 2e-3, "model.activation": "swiglu",
                                     "model.n_layer": 4})
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.model.activation, cfg.model.n_layer) == (
        2e-3, pytest.approx(2e-4), "swiglu", 4)


@pytest.mark.parametrize("text, message", [
    ("optim.lr: 0.01\n", "optim.lr in {f}: 0.01 is no distribution; give {{type: float"),
    ("optim.lr: {type: float, low: 1e-2, high: 1e-4}\n",
     "optim.lr in {f}: low 0.01 must be below high 0.0001"),
    ("optim.lr: {type: float, low: 0, high: 1, log: true}\n",
     "optim.lr in {f}: a log range needs low > 0, got 0"),
    ("optim.lr: {type: floats, low: 0, high: 1}\n",
     "optim.lr in {f}: type must be float, int or categorical, got 'floats'"),
    ("optim.lr: {type: float, low: 0, hihg: 1}\n",
     "optim.lr in {f}: unknown field 'hihg' for type float, did you mean 'high'?"),
    ("model.n_layer: {type: int, low: 1.5, high: 4}\n",
     "model.n_layer in {f}: low must be an integer, got 1.5"),
    ("model.activation: [gelu, gelu]\n",
     "model.activation in {f}: a choice is listed twice in ['gelu', 'gelu']"),
    ("trails: 5\n", "unknown setting 'trails' in {f}, did you mean 'trials'?"),
    ("sampler: cmaes\n", "sampler in {f}: 'cmaes' is not one of tpe, random, grid"),
    ("repeats: 0\n", "repeats in {f}: 0 must be an integer >= 1"),
    ("data.path: [a.txt, b.txt]\n", "data.path cannot be searched: a study trains every trial "
                                    "on the same data"),
])
def test_bad_search_files_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    items = search_of(tmp_path, text)
    with pytest.raises(CharlmError) as e:
        read_search(items)
    assert str(e.value).startswith(message.format(f=items[0]))


def test_a_space_that_can_give_an_invalid_config_is_refused_up_front(tmp_path: Path) -> None:
    base = load_config(TINY).to_dict()  # optim.min_lr: 1e-3
    search = read_search(["optim.lr={type: float, low: 1e-4, high: 1e-2, log: true}"])
    with pytest.raises(CharlmError) as e:
        check_space(search, base, "the search")
    assert str(e.value) == (
        "the search space can give an invalid config: with optim.lr=0.0001: invalid config "
        "value optim.min_lr: 0.001 must be in [0, lr], and lr is 0.0001; set optim.min_lr to "
        "at most lr, e.g. lr / 10 = 1e-05; search optim.min_lr with it (e.g. `optim.min_lr: "
        "{of: optim.lr, times: 0.1}` derives it from each trial's optim.lr), or fix it with "
        "--set")
    check_space(read_search(["optim.lr={type: float, low: 1e-4, high: 1e-2, log: true}",
                             "optim.min_lr={of: optim.lr, times: 0.1}"]), base, "the search")
    # two searched keys that only fail together: every combination of their ends is checked
    both = read_search(["model.n_embd=[32, 48]", "model.n_head=[2, 32]"])
    with pytest.raises(CharlmError, match=r"with model.n_embd=48, model.n_head=32: invalid "
                                          r"config value model.n_embd: 48 is not divisible"):
        check_space(both, base, "the search")
    with pytest.raises(CharlmError, match=r"unknown key 'model.n_layers', did you mean "
                                          r"'n_layer'\?"):
        check_space(read_search(["model.n_layers=[1, 2]"]), base, "the search")


# --- one trial: a child process followed through its metrics.jsonl ---------------------------

FAKE_TRAIN = """
import json, signal, sys, time
log, mode = sys.argv[1], sys.argv[2]
offset = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # another seed's values
signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))  # charlm train saves, then exits 143
with open(log, "a") as f:
    for step in (10, 20, 30, 40):
        f.write(json.dumps({"event": "eval", "step": step,
                            "best_val_loss": 4 - step / 100 + offset}) + "\\n")
        f.flush()
        if mode == "crash" and step == 20:
            print("warning: something\\nerror: boom", flush=True)
            sys.exit(2)
        if mode == "short" and step == 30:  # a time budget that allowed fewer steps
            sys.exit(0)
        if mode == "diverge" and step == 20:
            print("error: training stopped: 5 steps in a row, up to step 20, had a non-finite "
                  "loss or gradient norm (their updates were skipped)", flush=True)
            sys.exit(2)
        time.sleep(0.3 if mode != "slow" else 30)
"""


@pytest.mark.parametrize("mode, prune_at, state, value, step, error", [
    ("complete", None, "complete", 3.6, 40, None),
    ("complete", 30, "pruned", 3.7, 30, None),
    ("crash", None, "failed", 3.8, 20, "error: boom"),
    ("diverge", None, "diverged", 3.8, 20, "error: training stopped: 5 steps in a row, up to "
     "step 20, had a non-finite loss or gradient norm (their updates were skipped)"),
])
def test_a_trial_ends_complete_pruned_failed_or_diverged(
        tmp_path: Path, mode: str, prune_at: int | None, state: str, value: float, step: int,
        error: str | None) -> None:
    fake = write(tmp_path / "fake.py", FAKE_TRAIN)
    seen: list[int] = []

    def report(event: dict) -> bool:
        seen.append(event["step"])
        return event["step"] == prune_at

    run = tmp_path / "trial"
    outcome = run_trial([([sys.executable, str(fake), str(run / "metrics.jsonl"), mode], run)],
                        ENV, "best_val_loss", report, Stop(threading.Event(), threading.Event()))
    assert (outcome.state, outcome.value, outcome.step, outcome.error) == (
        state, pytest.approx(value), step, error)
    assert seen == [10, 20, 30, 40][:seen.index(step) + 1]  # each eval once, none after a prune


@pytest.mark.parametrize("modes, prune_at, state, value, step, error", [
    (("complete", "complete"), None, "complete", 3.7, 40, None),
    (("complete", "complete"), 20, "pruned", 3.9, 20, None),
    (("complete", "crash"), None, "failed", 3.9, 20, "error: boom"),
    # each ends where its budget did: the value is the mean of their own last evals
    (("complete", "short"), None, "complete", 3.75, 40, None),
])
def test_a_repeated_trial_reports_the_mean_of_its_runs(
        tmp_path: Path, modes: tuple[str, str], prune_at: int | None, state: str, value: float,
        step: int, error: str | None) -> None:
    """Two runs of one trial (the second's values 0.2 higher): each step is reported once
    both have logged it, with their mean; a prune stops both; one run's error fails it."""
    fake = write(tmp_path / "fake.py", FAKE_TRAIN)
    seen: list[tuple[int, float]] = []

    def report(event: dict) -> bool:
        seen.append((event["step"], event["best_val_loss"]))
        return event["step"] == prune_at

    runs = [([sys.executable, str(fake), str(tmp_path / name / "metrics.jsonl"), mode, offset],
             tmp_path / name)
            for name, mode, offset in zip(("a", "b"), modes, ("0", "0.2"), strict=True)]
    outcome = run_trial(runs, ENV, "best_val_loss", report,
                        Stop(threading.Event(), threading.Event()))
    assert (outcome.state, outcome.value, outcome.step, outcome.error) == (
        state, pytest.approx(value), step, error)
    steps = [10, 20, 30, 40][:[10, 20, 30, 40].index(step) + 1]
    if "short" in modes:  # step 40 was logged by one run only
        steps = [10, 20, 30]
    assert seen == [(s, pytest.approx(4.1 - s / 100)) for s in steps]
    if state == "pruned":  # both stopped, before their last eval
        assert [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl")
                .read_text().splitlines()][-1] <= 30


def test_a_stop_request_sends_one_sigterm_and_the_trial_is_interrupted(tmp_path: Path) -> None:
    fake = write(tmp_path / "fake.py", FAKE_TRAIN)
    stop = Stop(threading.Event(), threading.Event())
    threading.Timer(1.0, stop.requested.set).start()
    start = time.monotonic()
    cmd = [sys.executable, str(fake), str(tmp_path / "metrics.jsonl"), "slow"]
    outcome = run_trial([(cmd, tmp_path)], ENV, "best_val_loss", lambda e: False, stop)
    assert (outcome.state, outcome.step) == ("interrupted", 10)
    assert time.monotonic() - start < 10  # not the 30 s the child would sleep


def test_follower_reads_each_line_once_and_again_after_a_cut_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    follower = Follower(path)
    assert follower.events() == []
    write(path, '{"step": 1}\n{"step": 2}\n{"st')
    assert follower.events() == [{"step": 1}, {"step": 2}]
    with open(path, "a") as f:
        f.write('ep": 3}\n')
    assert follower.events() == [{"step": 3}]
    write(path, '{"step": 1}\n')  # a resumed run cut its log back
    assert follower.events() == [{"step": 1}]


# --- whole studies, run as a user would -------------------------------------------------------


def tune(*args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "charlm", "tune", *map(str, args)], cwd=cwd,
                          env=ENV, capture_output=True, text=True, timeout=240, **kw)


def start_tune(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "charlm", "tune", *map(str, args)], cwd=cwd,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(check, what: str, proc: subprocess.Popen, limit: float = 120) -> None:
    end = time.monotonic() + limit
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"charlm tune ended ({proc.returncode}) before its {what}: "
                                 + proc.communicate()[1])
        assert time.monotonic() < end, f"no {what} after {limit} s"
        time.sleep(0.1)


def load_study(out: Path, name: str | None = None, storage=None):
    if storage is None:
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "study.journal")))
    return optuna.load_study(study_name=name or out.name, storage=storage)


def processes_with(text: str) -> list[int]:
    """The pids whose command line holds `text` (a trial's run dir, say)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_text(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_a_study_records_crashed_and_diverged_trials_and_goes_on(tmp_path: Path, corpus: Path,
                                                                  cli) -> None:
    """Grid of 4: a good lr, a diverging one, each with a block too long for the val split."""
    out = tmp_path / "study"
    result = tune(TINY, "--search", "optim.lr=[0.01, 1000000.0]", "--search",
                  "model.block_size=[16, 5000]", "--sampler", "grid", "--workers", "2",
                  "--data", corpus, "--out", out, "--set", "train.max_iters=10", *QUICK,
                  cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    trials = {(t.params["optim.lr"], t.params["model.block_size"]): t
              for t in load_study(out).get_trials()}
    states = {k: (t.state.name, t.user_attrs["state"]) for k, t in trials.items()}
    assert states == {(0.01, 16): ("COMPLETE", "complete"), (1e6, 16): ("PRUNED", "diverged"),
                      (0.01, 5000): ("FAIL", "failed"), (1e6, 5000): ("FAIL", "failed")}
    assert trials[(0.01, 5000)].user_attrs["error"].startswith(
        "error: the val split of ") and "is too short" in trials[(0.01, 5000)].user_attrs["error"]
    assert "non-finite loss" in trials[(1e6, 16)].user_attrs["error"]
    table = (out / "trials.txt").read_text()
    assert table.splitlines()[1].split()[:2] == [str(trials[(0.01, 16)].number), "complete"]
    assert result.stdout.startswith(table)
    assert (out / "dataset" / "meta.json").is_file()  # prepared once, not per trial
    assert not (out / f"trial-{trials[(0.01, 16)].number:04d}" / "dataset").exists()
    # best.yaml: the best trial's full config, on the user's data, ready for charlm train
    best = load_config(out / "best.yaml")
    assert (best.optim.lr, best.model.block_size, best.train.max_iters) == (0.01, 16, 10)
    assert best.data.path == str(corpus) and best.train.out_dir == str(out / "best")
    trained = cli("train", out / "best.yaml")
    assert trained.code == 0, trained.err
    assert (out / "best" / "best.pt").is_file()


def test_ctrl_c_leaves_a_resumable_study_and_no_child(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "study"
    proc = start_tune(TINY, "--search", "optim.lr={type: float, low: 0.005, high: 0.01}",
                      "--data", corpus, "--out", out, "--trials", "1",
                      "--set", "train.max_iters=150", *QUICK, cwd=tmp_path)
    log = out / "trial-0000" / "metrics.jsonl"
    wait_for(lambda: log.is_file() and '"eval"' in log.read_text(), "first eval", proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert f"continue it with `charlm tune --out {out} --resume`" in stderr
    assert processes_with(str(out / "trial-0000")) == []  # no orphaned charlm train
    assert (out / "trial-0000" / "last.pt").is_file()
    (trial,) = load_study(out).get_trials()
    assert trial.state.name == "FAIL" and trial.user_attrs["interrupted"]
    saved = json.loads(log.read_text().splitlines()[-1])["step"]
    assert 0 < saved < 150

    resumed = tune("--out", out, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    first, again = load_study(out).get_trials()
    assert again.state.name == "COMPLETE" and again.params == first.params
    assert again.user_attrs["run_dir"] == str(out.resolve() / "trial-0000")  # went on there
    assert again.user_attrs["step"] == 150
    assert "resum" in (out / "trial-0000" / "train.log").read_text().lower()
    changed = tune("--out", out, "--resume", "--sampler", "random", cwd=tmp_path)
    assert (changed.returncode, changed.stderr.strip()) == (2, (
        "error: --resume continues the study as it was made; --sampler cannot change it (only "
        "--trials, --timeout, --workers can)"))


def test_a_repeated_trial_trains_each_seed_and_resumes_them(tmp_path: Path,
                                                           corpus: Path) -> None:
    """--repeats 2: the trial trains train.seed and seed + 1, each in its own dir; Ctrl-C stops
    both, --resume continues both, and the trial's value is the mean of their objectives."""
    out = tmp_path / "study"
    proc = start_tune(TINY, "--search", "optim.lr={type: float, low: 0.005, high: 0.01}",
                      "--data", corpus, "--out", out, "--trials", "1", "--repeats", "2",
                      "--set", "train.max_iters=150", "--set", "train.seed=7", *QUICK,
                      cwd=tmp_path)
    runs = [out / "trial-0000" / f"seed-{seed}" for seed in (7, 8)]
    logs = [run / "metrics.jsonl" for run in runs]
    wait_for(lambda: all(log.is_file() and '"eval"' in log.read_text() for log in logs),
             "first evals", proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert processes_with(str(out / "trial-0000")) == []
    assert [load_config(run / "trial.yaml").train.seed for run in runs] == [7, 8]
    assert all((run / "last.pt").is_file() for run in runs)

    resumed = tune("--out", out, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    first, again = load_study(out).get_trials()
    assert again.state.name == "COMPLETE" and again.params == first.params
    assert again.user_attrs["step"] == 150
    finals = [json.loads(log.read_text().splitlines()[-1]) for log in logs]
    assert [f["step"] for f in finals] == [150, 150]
    assert finals[0]["best_val_loss"] != finals[1]["best_val_loss"]  # two seeds, two runs
    assert again.value == pytest.approx((finals[0]["best_val_loss"]
                                         + finals[1]["best_val_loss"]) / 2)
    assert all("resum" in (run / "train.log").read_text().lower() for run in runs)
    assert load_config(out / "best.yaml").train.seed == 7  # the config, trained once


def two_workers(tmp_path: Path, corpus: Path, first: list, second: list, trials: int = 3):
    """Start a study, then a second worker on it once the first has made it; both must end.
    The second starts while the first's first trial runs, so it takes one of the other two
    (each trial is a `charlm train` process of several seconds)."""
    base = [TINY, "--search", "optim.lr={type: float, low: 0.005, high: 0.02, log: true}",
            "--data", corpus, "--trials", trials, "--set", "train.max_iters=30", *QUICK]
    one = start_tune(*base, *first, cwd=tmp_path)
    wait_for(lambda: list(tmp_path.glob("*/trial-0000/metrics.jsonl")), "first trial", one)
    two = start_tune(*(base if "--storage" in second else []), *second, cwd=tmp_path)
    for proc in (one, two):
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    return one, two


def check_shared(study, trials: int, pids: set[int]) -> None:
    numbers = sorted(t.number for t in study.get_trials())
    assert numbers == list(range(trials))  # no number twice, the total as asked
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in study.get_trials())
    workers = {int(t.user_attrs["worker"].rpartition(":")[2]) for t in study.get_trials()}
    assert workers == pids  # both ran trials


@pytest.mark.parametrize("name, text, arch", [
    ("t.txt", "hello world, hello world\n" * 20, "decoder"),
    ("p.tsv", "".join(f"{w}\t{w.upper()}\n" for w in ("cat", "dog", "hat", "bat", "rat") * 4),
     "encoder_decoder"),
])
def test_the_study_prepares_its_data_without_torch(tmp_path: Path, name: str, text: str,
                                                   arch: str) -> None:
    """`charlm tune`'s own process imported torch (2.6 s on the EPYC) to prepare the data
    once for every trial; the trials' `charlm train` processes are the ones that need it."""
    src = tmp_path / name
    src.write_text(text, encoding="utf-8")
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from charlm.config.loading import load_config\n"
            "from charlm.tune.space import read_search\n"
            "from charlm.tune.study import prepare_data\n"
            "cfg = load_config(sys.argv[1], [f'data.path={sys.argv[2]}', sys.argv[3]])\n"
            "print(prepare_data(cfg, read_search(['optim.lr=[0.01, 0.02]']), Path(sys.argv[4])))\n"
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, TINY, src, f"model.arch={arch}",
                             tmp_path / "study"], env=ENV, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str((tmp_path / "study" / "dataset").resolve()), "False"]
    assert (tmp_path / "study" / "dataset" / "meta.json").is_file()


def test_two_workers_share_the_journal_file(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "study"
    one, two = two_workers(tmp_path, corpus, ["--out", out], ["--out", out, "--resume"])
    study = load_study(out)
    check_shared(study, 3, {one.pid, two.pid})
    best = load_config(out / "best.yaml")
    assert best.optim.lr == study.best_trial.params["optim.lr"]


DATABASES = {  # name: (env var with the URL, an example URL, SQL that tries the tuner's lock)
    "postgresql": ("CHARLM_TEST_POSTGRES_URL", "postgresql://USER@HOST/DB",
                   "SELECT pg_try_advisory_lock(4242)::int"),
    "mysql": ("CHARLM_TEST_MYSQL_URL", "mysql+pymysql://USER@HOST/DB",
              "SELECT GET_LOCK('charlm_tune', 0)"),
}


def database_url(name: str) -> str:
    env, example, _ = DATABASES[name]
    url = os.environ.get(env)
    if not url:
        pytest.skip(f"set {env}={example} to run it (.ci/run starts the server and sets it)")
    return url


@pytest.mark.xdist_group("databases")  # both take the same lock on the same servers
@pytest.mark.parametrize("name", DATABASES)
def test_the_tuner_holds_the_databases_lock_for_other_machines(tmp_path: Path,
                                                               name: str) -> None:
    """Workers on other machines (another --out, so another file lock) wait for it."""
    from sqlalchemy import text

    from charlm.tune.runner import Tuner
    from charlm.tune.study import Plan
    from charlm.tune.workers import DATABASE_LOCKS

    url = database_url(name)
    plan = Plan(tmp_path, load_config(TINY).to_dict(), read_search(["optim.lr=[0.002, 0.01]"]),
                url, f"test-{uuid.uuid4().hex[:8]}", "data")
    tuner = Tuner(plan, 1, 5, None)
    dialect = tuner.storage.engine.dialect.name
    with tuner.storage.engine.connect() as other:
        with tuner.lock():
            assert other.execute(text(DATABASES[name][2])).scalar() == 0  # held by the tuner
        assert other.execute(text(DATABASES[name][2])).scalar() == 1  # given back
        other.execute(text(DATABASE_LOCKS[dialect][1]))


@pytest.mark.xdist_group("databases")
@pytest.mark.parametrize("name", DATABASES)
def test_two_machines_share_a_study_in_a_database(tmp_path: Path, corpus: Path,
                                                  name: str) -> None:
    url = database_url(name)
    name = f"test-{uuid.uuid4().hex[:8]}"
    db = ["--storage", url, "--study", name]
    one, two = two_workers(tmp_path, corpus, ["--out", tmp_path / "a", *db],
                           ["--out", tmp_path / "b", *db])
    study = optuna.load_study(study_name=name, storage=url)
    check_shared(study, 3, {one.pid, two.pid})
    for out in ("a", "b"):  # each machine's best.yaml agrees with the database
        best = load_config(tmp_path / out / "best.yaml")
        assert best.optim.lr == study.best_trial.params["optim.lr"]


# --- the command's errors, and how values are reported ---------------------------------------


def test_tune_command_errors_are_one_line(cli, tmp_path: Path, corpus: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "study"
    lr = "optim.lr={type: float, low: 1e-3, high: 1e-2}"
    cases = [
        ((TINY, "--out", out), "error: give the search space with --search FILE or --search "
                               "KEY=SPEC"),
        (("--out", out, "--resume"), f"error: --resume: {out} holds no study (tune.yaml is "
                                     "missing); start one with `charlm tune CONFIG --search FILE "
                                     "--out DIR`"),
        ((TINY, "--search", lr, "--out", out, "--storage", "sqlite:///x.db"),
         "error: --storage: SQLite cannot take several workers at once; use the default journal "
         "file in --out, or PostgreSQL / MySQL"),
        ((TINY, "--search", lr, "--out", out, "--objective", "val_cer"),
         "error: objective val_cer is measured on pairs (model.arch=encoder_decoder); a GPT's "
         "objectives are best_val_loss, final_val_loss"),
        ((TINY, "--search", lr, "--out", out, "--workers", "0"),
         "error: --workers must be >= 1, got 0"),
        ((TINY, "--search", lr, "--out", out, "--repeats", "0"),
         "error: repeats in the options: 0 must be an integer >= 1"),
        ((TINY, "--search", "optim.lr={type: float, low: 1e-4, high: 1e-2}", "--out", out),
         "error: the search space can give an invalid config: with optim.lr=0.0001: invalid "
         "config value optim.min_lr"),
    ]
    for args, line in cases:
        result = cli("tune", *args, "--data", corpus) if args[0] == TINY else cli("tune", *args)
        assert (result.code, result.err.splitlines()[0][:len(line)]) == (2, line)
        assert len(result.err.splitlines()) == 1
        assert not (out / "tune.yaml").exists()
    monkeypatch.setitem(sys.modules, "optuna", None)  # the extra is not installed
    result = cli("tune", TINY, "--search", lr, "--out", out)
    assert (result.code, result.err) == (
        2, "error: charlm tune needs Optuna: pip install 'charlm[tune]'\n")


@pytest.mark.parametrize("spec, expected", [
    ("optim.lr=[0.002, 0.01]", {20: 3.0, 40: 2.5, 60: 2.4}),  # at the step
    # a batch of 32 sees the base config's (16) tokens of 40 steps in 20, of 80 in 40, ...
    ("train.batch_size=[8, 32]", {40: 3.0, 80: 2.5, 120: 2.4}),
])
def test_values_are_reported_at_tokens_seen_when_a_step_changes_size(
        tmp_path: Path, spec: str, expected: dict[int, float]) -> None:
    from charlm.tune.runner import Tuner
    from charlm.tune.study import Plan

    base = load_config(TINY).to_dict()  # batch 16 x block 16, an eval every 20 steps
    tuner = Tuner(Plan(tmp_path, base, read_search([spec]), None, "s", "data"), 1, 5, None)
    trial = tuner.study.ask()
    report = tuner.reporter(trial)
    for step, value in ((20, 3.0), (40, 2.5), (60, 2.4)):
        assert not report({"event": "eval", "step": step, "tokens": step * 32 * 16,
                           "best_val_loss": value})
    assert tuner.study.get_trials()[0].intermediate_values == expected


def test_a_trial_is_not_pruned_at_its_final_eval(tmp_path: Path) -> None:
    """Worse than the median of two complete trials: pruned at step 40, not at step 60, its
    train.max_iters (it has trained to its end, and completes)."""
    from charlm.tune.runner import Tuner
    from charlm.tune.study import Plan

    base = load_config(TINY, ["train.max_iters=60"]).to_dict()
    search = read_search(["optim.lr=[0.002, 0.01]", "startup_trials=2", "pruner_warmup=0"])
    tuner = Tuner(Plan(tmp_path, base, search, None, "s", "data"), 1, 5, None)
    for _ in range(2):
        done = tuner.study.ask()
        for step in (20, 40, 60):
            done.report(2.0, step)
        tuner.study.tell(done, 2.0)
    trial = tuner.study.ask()
    report = tuner.reporter(trial, last_step=60)
    assert [report({"event": "eval", "step": s, "best_val_loss": 3.0}) for s in (20, 40, 60)] == [
        True, True, False]
    assert tuner.study.get_trials()[2].intermediate_values == {20: 3.0, 40: 3.0, 60: 3.0}


def test_an_error_in_a_worker_stops_the_study_with_one_line(tmp_path: Path) -> None:
    from charlm.tune.runner import Tuner
    from charlm.tune.study import Plan

    base = load_config(TINY).to_dict()
    tuner = Tuner(Plan(tmp_path, base, read_search(["optim.lr=[0.002, 0.01]"]), None, "s",
                       "data"), 2, 5, None)

    def lost(trial, slot: int) -> None:
        raise RuntimeError("server closed the connection unexpectedly\nmore detail")

    tuner.run_one = lost
    with pytest.raises(CharlmError) as e:
        tuner.run()
    assert str(e.value) == (
        "the study stopped: RuntimeError: server closed the connection unexpectedly; its trials "
        f"so far are saved: continue with `charlm tune --out {tmp_path} --resume` once the cause "
        "is fixed")


def test_the_grid_sampler_ends_the_grid_without_raising() -> None:
    """Optuna's GridSampler calls Study.stop after the last point, which raises outside
    Study.optimize: the last trial of a grid was never recorded."""
    from charlm.tune.study import make_sampler

    search = read_search(["optim.lr=[0.002, 0.01]"])
    study = optuna.create_study(sampler=make_sampler(search, 0, 1))
    for _ in range(2):
        trial = study.ask()
        study.tell(trial, search.params["optim.lr"].suggest(trial))
    assert sorted(t.params["optim.lr"] for t in study.get_trials()) == [0.002, 0.01]
    assert all(t.state.name == "COMPLETE" for t in study.get_trials())


def test_the_pruner_judges_from_half_the_steps_unless_told() -> None:
    from charlm.tune.study import make_pruner

    base = load_config(TINY, ["train.max_iters=600"]).to_dict()
    assert make_pruner(read_search(["optim.lr=[0.002, 0.01]"]), base)._n_warmup_steps == 300
    told = read_search(["optim.lr=[0.002, 0.01]", "pruner_warmup=40"])
    assert make_pruner(told, base)._n_warmup_steps == 40
