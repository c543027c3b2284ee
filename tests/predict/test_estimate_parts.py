"""The estimate's parts (``profkit.predict.memory``): how contributions combine, and that each mechanism's part is
what the combined estimate holds for it, on every training method of the micro preset."""

from __future__ import annotations

import pytest

from profkit.core import gpus
from profkit.core.methods import METHODS
from profkit.core.settings import RunSettings
from profkit.predict.estimate import estimate_run
from profkit.predict.memory.contribution import INSTANTS, Contribution, combine

TRAINING = [name for name, m in METHODS.items() if m.kind == "train"]


def test_combine_adds_bytes_by_instant_and_keeps_the_order_of_detail_and_notes():
    params = Contribution(detail={"a": 1}, notes=["first"]).throughout("parameters_frozen", 100)
    zero = Contribution(detail={"b": 2, "a": 3}, notes=["second"], host={"optimizer_state": 7})
    zero.throughout("parameters_frozen", -60).add("temporaries", backward=5)
    total = combine([params, zero])
    assert [total.at(i, "parameters_frozen") for i in INSTANTS] == [40, 40, 40]
    assert [total.at(i, "temporaries") for i in INSTANTS] == [0, 5, 0]
    assert list(total.detail.items()) == [("a", 3), ("b", 2)]  # a later value replaces, in the first one's place
    assert total.notes == ["first", "second"] and total.host == {"optimizer_state": 7}
    assert params.at("forward", "parameters_frozen") == 100  # the parts themselves are left as they were


@pytest.mark.parametrize("name", TRAINING)
def test_each_mechanism_holds_what_its_part_names(name):
    """Every training method of micro on a CUDA target over two ranks: the categories each mechanism owns hold what
    its detail says, at the instants it says."""
    method = METHODS[name]
    e = estimate_run(method, RunSettings(method=name, preset="micro"), "cuda", 2)
    d = e.detail
    assert sum(e.params.values()) > 0 and e.params["trainable"] > 0
    if method.fsdp:
        # the root unit stays gathered from forward to the end of backward
        assert e.instants["forward"]["parameters_unsharded"] >= d["fsdp_root_gathered"] > 0
        assert e.instants["optimizer"]["parameters_unsharded"] == 0
    elif method.zero_stage:
        assert d["zero_fp32_master_partition"] > 0
        assert "ddp_gradient_buckets" not in d
    else:  # DDP: its buckets are a second copy of the trainable gradients, held from the wrap on
        trainable = d["ddp_gradient_buckets"]
        assert trainable > 0
        assert e.instants["forward"]["gradients"] == trainable
        assert e.instants["optimizer"]["gradients"] == 2 * trainable
    assert e.instants["backward"]["temporaries"] >= d["loss_backward"] or method.fsdp
    assert e.instants["optimizer"]["activations"] == 0


def test_whether_a_step_fits_a_gpu_is_the_estimate_s_answer():
    e = estimate_run(METHODS["lora"], RunSettings(method="lora", preset="micro"), "cuda")
    big, small = gpus.find("A100-SXM4-80GB"), gpus.find("A100-SXM4-40GB")
    answer = e.on_gpu(big)
    assert answer["fits"] and answer["basis"] == "replay" and 0 < answer["share"] < 0.01
    assert answer["capacity_bytes"] < big.memory_bytes  # the CUDA context lies outside the allocator's room
    assert e.on_gpu(small)["capacity_bytes"] < answer["capacity_bytes"]
    on_cpu = estimate_run(METHODS["lora"], RunSettings(method="lora", preset="micro"), "cpu")
    assert on_cpu.on_gpu(small)["basis"] == "allocated peak"
