"""Every causal-LM architecture the installed transformers knows, from its default config shrunk to two layers:
estimated, or refused with a reason (``EstimateError``), never another exception. Models whose default config
transformers itself cannot build are skipped by name, with transformers' own error, not counted as estimated."""

from __future__ import annotations

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from profkit.core.methods import get_method
from profkit.model.build import shrunk_default_config
from profkit.predict.estimate import EstimateError, estimate


def test_every_architecture_is_estimated_or_refused_with_a_reason():
    crashed, estimated, refused, unbuildable = [], 0, 0, 0
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = shrunk_default_config(model_type)
        except Exception:  # transformers' own default config fails its own validation: nothing to estimate
            unbuildable += 1
            continue
        for name in ("full_gc", "lora", "qlora"):
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
