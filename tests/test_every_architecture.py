"""Every causal-LM architecture the installed transformers knows, from its default config shrunk to two layers:
estimated, or refused with a reason (``EstimateError``), never another exception. Models whose default config
transformers itself cannot build are skipped by name, with transformers' own error, not counted as estimated.

Each architecture is estimated under one method, the three methods taken in turn (about 200 architectures, so
each method meets over 60 of them): the sweep is after what an architecture breaks, and three estimates of each
took over 15 minutes on a 2-core machine, most of the test command's budget."""

from __future__ import annotations

import pytest

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from profkit.core.methods import get_method
from profkit.model.build import shrunk_default_config
from profkit.predict.estimate import EstimateError, estimate


METHODS_IN_TURN = ("full_gc", "lora", "qlora")


@pytest.mark.long  # a sweep over every architecture: make test-all
def test_every_architecture_is_estimated_or_refused_with_a_reason():
    crashed, estimated, refused, unbuildable = [], 0, 0, 0
    for index, model_type in enumerate(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)):
        try:
            config = shrunk_default_config(model_type)
        except Exception:  # transformers' own default config fails its own validation: nothing to estimate
            unbuildable += 1
            continue
        name = METHODS_IN_TURN[index % len(METHODS_IN_TURN)]
        try:
            estimate(get_method(name), config, 1, 32, 1, "cuda", model_type)
            estimated += 1
        except EstimateError as exc:
            assert str(exc).strip(), model_type
            refused += 1
        except Exception as exc:
            crashed.append(f"{model_type} {name}: {type(exc).__name__}: {str(exc)[:120]}")
    assert not crashed, "\n".join(crashed)
    assert estimated > refused and unbuildable < 10, (estimated, refused, unbuildable)
