"""The public API, composed: ``profkit.Session`` and ``profkit.TrainerCallback`` are the recording layer's, given
the estimate as their predictor, so that a user's own run carries the prediction beside what it measured. This is
the one place where recording and predicting meet."""

from __future__ import annotations

from profkit.predict.live import estimate_live
from profkit.record import hf, session


class Session(session.Session):
    __doc__ = session.Session.__doc__

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("predict", estimate_live)
        super().__init__(*args, **kwargs)


class TrainerCallback(hf.TrainerCallback):
    __doc__ = hf.TrainerCallback.__doc__
    session_class = Session
