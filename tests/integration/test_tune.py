"""charlm tune: one trial's child process and how it ends, and whole studies run as a user would
(crash, divergence, Ctrl-C and --resume, two workers on the journal file, on PostgreSQL and on
MySQL)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from charlm.config.loading import load_config
from charlm.tune.space import read_search
from charlm.tune.trial import Stop, run_trial
from tests.helpers import TINY, write

optuna = pytest.importorskip("optuna")


# Trials of a few seconds: a small eval and no samples; one thread each (two cores, two workers).
QUICK = ["--set", "train.eval_interval=5", "--set", "train.eval_iters=2", "--set",
         "train.sample_chars=0", "--set", "train.log_interval=5"]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


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
        if mode == "ended" and step < 40:  # resumed after it had trained to its end
            continue
        if mode == "ended":
            print("error: --resume: nothing to train: last.pt is at step 40 and "
                  "train.max_iters is 40; ...", flush=True)
            sys.exit(2)
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
    # a seed that had ended before its trial was resumed (`--resume` has nothing to train)
    (("complete", "ended"), None, "complete", 3.7, 40, None),
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


@contextlib.contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """A new, empty database on the server of `url`, dropped afterwards: its URL."""
    from sqlalchemy import create_engine, make_url, text

    server = make_url(url)
    name = f"charlm_fresh_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        force = " WITH (FORCE)" if admin.dialect.name == "postgresql" else ""
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
        admin.dispose()


@pytest.mark.xdist_group("databases")  # both take the same lock on the same servers
@pytest.mark.parametrize("name", DATABASES)
def test_the_tuner_holds_the_databases_lock_for_other_machines(tmp_path: Path,
                                                               name: str) -> None:
    """Workers on other machines (another --out, so another file lock) wait for it. The
    tuner is a fresh database's first user, as on a new CI server, whatever ran before."""
    from sqlalchemy import text

    from charlm.tune.runner import Tuner
    from charlm.tune.study import DATABASE_LOCKS, StudyConfig

    with fresh_database(database_url(name)) as url:
        plan = StudyConfig(tmp_path, load_config(TINY).to_dict(),
                    read_search(["optim.lr=[0.002, 0.01]"]), url, "locked", "data")
        tuner = Tuner(plan, 1, 5, None)
        dialect = tuner.storage.engine.dialect.name
        try:
            with tuner.storage.engine.connect() as other:
                with tuner.lock():
                    assert other.execute(text(DATABASES[name][2])).scalar() == 0  # the tuner's
                assert other.execute(text(DATABASES[name][2])).scalar() == 1  # given back
                other.execute(text(DATABASE_LOCKS[dialect][1]))
        finally:
            tuner.storage.engine.dispose()


MEET_S = 3  # how long the hook below holds one tuner for the other: long past its connecting


@pytest.mark.xdist_group("databases")
@pytest.mark.parametrize("name", DATABASES)
def test_two_tuners_open_a_fresh_database_at_once(tmp_path: Path, name: str) -> None:
    """Two machines' first `charlm tune --storage URL` on a new database at the same moment
    both open it. The race made certain: a hook holds each tuner after it has found Optuna's
    tables missing, until the other has found them missing too (or MEET_S, when the database's
    lock keeps the other out); before the fix both then created them and one failed
    (PostgreSQL: UniqueViolation on CREATE TYPE studydirection)."""
    from optuna.storages._rdb import models
    from sqlalchemy import event

    from charlm.tune.study import StudyConfig, make_storage

    met, arrived, errors, storages = threading.Event(), [], [], []

    def hold(*args, **kwargs) -> None:  # Optuna's tables found missing, none created yet
        arrived.append(threading.get_ident())
        if len(arrived) == 2:
            met.set()
        met.wait(MEET_S)

    def open_storage(url: str) -> None:
        plan = StudyConfig(tmp_path, load_config(TINY).to_dict(),
                    read_search(["optim.lr=[0.002, 0.01]"]), url, "fresh", "data")
        try:
            storages.append(make_storage(plan))
        except Exception as e:  # the CharlmError that a failed creation became
            errors.append(e)

    metadata = models.BaseModel.metadata
    with fresh_database(database_url(name)) as url:
        event.listen(metadata, "before_create", hold, insert=True)  # before the types, too
        try:
            tuners = [threading.Thread(target=open_storage, args=(url,)) for _ in range(2)]
            for t in tuners:
                t.start()
            for t in tuners:
                t.join(60)
        finally:
            event.remove(metadata, "before_create", hold)
        try:
            assert [str(e) for e in errors] == [] and len(storages) == 2 and len(arrived) == 2
            study = optuna.create_study(storage=storages[1], study_name="fresh")
            assert optuna.load_study(study_name="fresh", storage=storages[0]).study_name == \
                study.study_name
        finally:
            for storage in storages:
                storage.engine.dispose()


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's")
def test_a_killed_tuners_trial_saves_and_ends_with_it(tmp_path: Path, corpus: Path) -> None:
    """`kill -9` of the tuner: its trial's `charlm train` gets a SIGTERM from the kernel, saves
    last.pt and ends, instead of training on as an orphan beside a resumed study."""
    out = tmp_path / "study"
    run = out / "trial-0000"
    log = run / "metrics.jsonl"
    proc = start_tune(TINY, "--search", "optim.lr=[0.005, 0.01]", "--data", corpus, "--out", out,
                      "--trials", "1", "--set", "train.max_iters=3000", *QUICK, cwd=tmp_path)
    try:
        wait_for(lambda: log.is_file() and '"eval"' in log.read_text(), "first eval", proc)
        proc.kill()
        end = time.monotonic() + 20
        while processes_with(str(run)) and time.monotonic() < end:
            time.sleep(0.1)
        assert processes_with(str(run)) == []
    finally:
        proc.kill()
        proc.communicate()
        for pid in processes_with(str(run)):  # an orphan that a failed check left behind
            os.kill(pid, signal.SIGKILL)
    assert "SIGTERM: finishing this step and saving last.pt" in (run / "train.log").read_text()
    assert (run / "last.pt").is_file()
    assert json.loads(log.read_text().splitlines()[-1])["step"] < 3000
