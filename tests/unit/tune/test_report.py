"""charlm.tune.report: the table of trials speaks the user's words, never Optuna's states."""

from __future__ import annotations

import re

import pytest

optuna = pytest.importorskip("optuna")


def test_the_table_names_each_state_in_words() -> None:
    """A killed tuner's trial (interrupted), one it left without a word (failed), one another
    worker still runs and one queued: none shows Optuna's fail / running / waiting."""
    from optuna.trial import TrialState

    from charlm.tune.report import table

    study = optuna.create_study()
    done = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-3, 1e-2)})
    done.set_user_attr("state", "complete")
    study.tell(done, 2.5)
    killed = study.ask()
    killed.set_user_attr("interrupted", True)
    study.tell(killed, state=TrialState.FAIL)
    study.tell(study.ask(), state=TrialState.FAIL)
    study.ask()  # still running
    study.enqueue_trial({})
    rows = [re.split(r"\s{2,}", line)[:2] for line in table(study).splitlines()]
    assert rows == [["trial", "state"], ["0", "complete"], ["1", "interrupted"], ["2", "failed"],
                    ["3", "still running"], ["4", "queued"]]
