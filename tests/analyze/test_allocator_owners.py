"""The CUDA allocator's history matched to the storage lifetimes of the same step (``analyze.allocator_owners``):
each block takes the owner of the storage the dispatcher saw allocated at its address with its size, in order;
a block no storage matches was allocated outside the dispatcher and is unattributed, never guessed. On a GPU the
same comparison runs on a real recording (``analyses/gpu_check.py``)."""

from __future__ import annotations

from profkit.analyze.allocator_owners import attribute_history

PARAM, ACTIVATION, WORKSPACE, GRADIENT, BEFORE_WINDOW = 0x1000, 0x2000, 0x3000, 0x4000, 0x5000
EVENTS = [  # (t_ns, action, storage, bytes, device, address, op, phase, inputs): store.LIFETIME_EVENT_COLUMNS
    (1, "existing", 0, 4096, "cuda:0", PARAM, "", "forward", ()),
    (2, "alloc", 1, 1000, "cuda:0", ACTIVATION, "aten::mm", "forward", (0,)),
    (3, "saved", 1, 1000, "cuda:0", ACTIVATION, "", "forward", ()),
    (4, "alloc", 2, 600, "cuda:0", WORKSPACE, "aten::add", "backward", (1,)),
    (5, "free", 2, 0, "cuda:0", 0, "", "backward", ()),
    (6, "alloc", 3, 4096, "cuda:0", GRADIENT, "aten::mm", "backward", ()),
    (7, "owner:gradients", 3, 4096, "cuda:0", 0, "", "backward", ()),
]
STATIC = {("cuda:0", PARAM): "parameters_trainable"}
WINDOW = (100, 200)


def history(*extra: dict) -> dict:
    entries = [
        {"action": "alloc", "addr": BEFORE_WINDOW, "size": 512, "time_us": 50},  # the cycle, before the step
        {"action": "free_completed", "addr": BEFORE_WINDOW, "size": 512, "time_us": 60},
        {"action": "alloc", "addr": ACTIVATION, "size": 1000, "time_us": 110},
        {"action": "alloc", "addr": WORKSPACE, "size": 600, "time_us": 120},
        {"action": "free_completed", "addr": WORKSPACE, "size": 600, "time_us": 130},
        {"action": "alloc", "addr": WORKSPACE, "size": 2048, "time_us": 135},  # an op's own workspace
        {"action": "alloc", "addr": GRADIENT, "size": 4096, "time_us": 140},
        {"action": "free_completed", "addr": WORKSPACE, "size": 2048, "time_us": 150},
        {"action": "free_completed", "addr": ACTIVATION, "size": 1000, "time_us": 160},
        *extra,
    ]
    segments = [{"device": 0, "address": PARAM, "total_size": 4096,
                 "blocks": [{"size": 4096, "requested_size": 4096, "state": "active_allocated"}]},
                {"device": 0, "address": GRADIENT, "total_size": 4096,
                 "blocks": [{"size": 4096, "requested_size": 4096, "state": "active_allocated"}]}]
    return {"segments": segments, "device_traces": [entries]}


def test_blocks_take_the_owners_of_the_storages_at_their_address():
    found = attribute_history(history(), EVENTS, STATIC, WINDOW, 0)
    assert found.peak_bytes == 4096 + 1000 + 2048 + 4096
    assert found.by_category == {"parameters_trainable": 4096, "activations": 1000, "unattributed": 2048,
                                 "gradients": 4096}
    assert (found.matched, found.allocations, found.unseen_bytes) == (3, 4, 2048)
    assert found.notes and "1 of the followed step's 4 allocations" in found.notes[0]


def test_a_size_that_does_not_match_is_not_the_storage():
    """The allocator rounds requests up to 512 bytes: 1000 and 1024 are one block, 1000 and 1536 are not."""
    events = [e if e[2] != 1 else (*e[:3], 1536, *e[4:]) for e in EVENTS]
    found = attribute_history(history(), events, STATIC, WINDOW, 0)
    assert "activations" not in found.by_category and found.unseen_bytes == 2048 + 1000


def test_no_history_inside_the_step_is_no_answer():
    assert attribute_history(history(), EVENTS, STATIC, (1_000, 2_000), 0) is None
    assert attribute_history({"segments": [], "device_traces": []}, EVENTS, STATIC, WINDOW, 0) is None
