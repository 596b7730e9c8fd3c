"""What a `charlm tune` study is (`StudyConfig`, kept in OUT/tune.yaml for --resume), and the
Optuna storage (with a database's named lock), sampler and pruner made from it. OUT also holds
`study.journal` (the default storage), the prepared `dataset/` and a run dir per trial."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend

from charlm.config.schema import RunConfig
from charlm.config.yaml_files import dump_yaml, read_yaml_file, untext
from charlm.core.errors import CharlmError, one_line
from charlm.core.files import make_writable_dir, write_text_atomic
from charlm.data.datasets import prepared_data, prepared_dir
from charlm.tune.space import Search, add, check_space, lookup

STUDY_FILE, JOURNAL = "tune.yaml", "study.journal"
RESUMABLE = ("--trials", "--timeout", "--workers")  # what --resume may change


@dataclass
class StudyConfig:
    """A study, as OUT/tune.yaml keeps it: `base` is resolved, `data` prepared once."""

    out: Path
    base: dict[str, Any]
    search: Search
    storage: str | None
    study_name: str
    data: str

    def save(self) -> None:
        write_text_atomic(self.out / STUDY_FILE, dump_yaml({
            "config": self.base, "search": {**self.search.spec(), **self.search.settings},
            "storage": self.storage, "study": self.study_name, "data": self.data}))

    @classmethod
    def load(cls, out: Path) -> StudyConfig:
        path = out / STUDY_FILE
        if not path.is_file():
            raise CharlmError(f"--resume: {out} holds no study ({STUDY_FILE} is missing); start "
                              "one with `charlm tune CONFIG --search FILE --out DIR`")
        raw = untext(read_yaml_file(path))
        try:
            search = Search()
            for key, spec in raw["search"].items():
                add(search, key, spec, str(path))
            RunConfig.from_dict(raw["config"], str(path))
            return cls(out, raw["config"], search, raw["storage"], raw["study"], raw["data"])
        except (KeyError, TypeError, AttributeError) as e:
            raise CharlmError(f"{path} is damaged ({one_line(e)}); start a new study") from None

    def trial_base(self, run_dir: Path) -> dict[str, Any]:
        base = copy.deepcopy(self.base)
        base["data"]["path"], base["train"]["out_dir"] = self.data, str(run_dir)
        return base


def new_study(cfg: RunConfig, search: Search, out: Path, storage: str | None,
              study_name: str | None) -> StudyConfig:
    base = cfg.to_dict()
    check_space(search, base, "the search")
    objective = search.setting("objective")
    if objective.startswith("val_") and cfg.model.arch != "encoder_decoder":
        raise CharlmError(f"objective {objective} is measured on pairs (model.arch="
                          "encoder_decoder); a GPT's objectives are best_val_loss, final_val_loss")
    if (out / STUDY_FILE).exists():
        raise CharlmError(f"{out} already holds a study; continue it with --resume, or choose "
                          "another --out")
    if storage and storage.startswith("sqlite"):
        raise CharlmError("--storage: SQLite cannot take several workers at once; use the "
                          "default journal file in --out, or PostgreSQL / MySQL")
    make_writable_dir(out, f"--out {out}")
    study_cfg = StudyConfig(out, base, search, storage, study_name or out.resolve().name,
                            cfg.data.path)
    if storage:  # a wrong URL or a missing driver is said before the data is prepared
        make_storage(study_cfg)
    study_cfg.data = prepare_data(cfg, search, out)
    study_cfg.save()
    return study_cfg


def prepare_data(cfg: RunConfig, search: Search, out: Path) -> str:
    """The data every trial trains on: a prepared dataset dir as is, else the text prepared
    once into OUT/dataset (pairs whose length limits follow a searched block_size: each trial
    prepares its own)."""
    limits = cfg.data.max_source_len is not None and cfg.data.max_target_len is not None
    if (path := prepared_dir(cfg.data)) is not None or (
            cfg.data.pairs and "model.block_size" in search.params and not limits):
        return str(Path(cfg.data.inputs[0] if path is None else path).resolve())
    print(f"preparing {cfg.data.shown} once for every trial ...", file=sys.stderr)
    prepared_data(cfg, out / "dataset")
    return str((out / "dataset").resolve())


# A database's named lock, held by one session at a time: (take it, waiting; give it back).
# MySQL's GET_LOCK waits a year: MariaDB takes no lock (NULL) for its "forever", -1.
MYSQL_LOCK = ("SELECT GET_LOCK('charlm_tune', 31536000)", "SELECT RELEASE_LOCK('charlm_tune')")
DATABASE_LOCKS = {
    "postgresql": ("SELECT pg_advisory_lock(4242)", "SELECT pg_advisory_unlock(4242)"),
    "mysql": MYSQL_LOCK, "mariadb": MYSQL_LOCK,
}


@contextlib.contextmanager
def database_lock(engine: Any) -> Iterator[None]:
    """Hold the database's named lock on a connection of its own; no engine or lock: nothing."""
    sql = None if engine is None else DATABASE_LOCKS.get(engine.dialect.name)
    if sql is None:
        yield
        return
    from sqlalchemy import text

    with engine.connect() as conn:
        conn.execute(text(sql[0]))
        try:
            yield
        finally:
            conn.execute(text(sql[1]))


def make_storage(study_cfg: StudyConfig) -> Any:
    """OUT's journal file, or the --storage database, whose first user creates Optuna's tables
    under the database's named lock (two machines starting at once would both find them
    missing, and one fail creating them)."""
    url = study_cfg.storage
    if url is None:
        return optuna.storages.JournalStorage(JournalFileBackend(str(study_cfg.out / JOURNAL)))
    try:
        from sqlalchemy import create_engine

        lock_engine = create_engine(url)
        try:
            with database_lock(lock_engine):
                return optuna.storages.RDBStorage(url)
        finally:
            lock_engine.dispose()
    except ImportError as e:
        raise CharlmError(f"--storage needs a database driver: {one_line(e)}; pip install "
                          "'psycopg[binary]' (PostgreSQL) or pymysql (MySQL)") from None
    except Exception as e:  # sqlalchemy's errors: a wrong URL, a database that is down
        raise CharlmError(f"cannot open --storage {hidden(url)}: {one_line(e)}") from None


def hidden(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(the URL given)"


class EndlessGrid(optuna.samplers.GridSampler):
    """GridSampler without its `Study.stop` at the grid's end, which raises in an ask-and-tell study
    (before the last trial is recorded); the tuner ends at --trials, by default the grid's size."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        pass


def make_sampler(search: Search, seed: int | None, workers: int) -> Any:
    name = search.setting("sampler")
    if name == "grid":
        return EndlessGrid({p.key: p.grid() for p in search.sampled()}, seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=search.setting("startup_trials"),
                                      multivariate=True, constant_liar=workers > 1)


def make_pruner(search: Search, base: dict[str, Any]) -> Any:
    name, warmup = search.setting("pruner"), search.setting("pruner_warmup")
    interval, steps = lookup(base, "train.eval_interval"), lookup(base, "train.max_iters")
    if warmup is None:  # a higher lr looks worse early under a cosine: judge from half-way on
        warmup = steps // 2
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=search.setting("startup_trials"),
                                           n_warmup_steps=warmup)
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(warmup, interval))
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(warmup, interval),
                                              max_resource=steps)
    return optuna.pruners.NopPruner()
