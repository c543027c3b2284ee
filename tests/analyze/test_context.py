"""Context decides before names: the module a stack shows, an annotation, the autograd sequence number that carries
a forward op's layer to its backward node, and runtime calls outside any op. A small synthetic trace holds one of
each, as a user's trace recorded with ``with_stack=True`` (module frames) and kernels has them."""

from __future__ import annotations

import json

import pytest

from profkit.analyze.categories import context_of, kernel_function
from profkit.analyze.time import analyze_time
from profkit.analyze.trace import load_trace


class TraceWriter:
    """Nested host events on one thread, each op launching one kernel of the given name."""

    def __init__(self):
        self.events, self.ts, self.corr = [], 0.0, 0

    def frame(self, name: str, body, cat: str = "python_function"):
        start = self.ts
        self.ts += 1
        body()
        self.ts += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": start,
                            "dur": self.ts - start})

    def op(self, name: str, kernel: str | None = None, seq: int = -1, cat: str = "cpu_op"):
        start = self.ts
        args = {"Sequence number": seq} if seq >= 0 else {}
        if kernel:
            self.launch(kernel, start + 1)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": start, "dur": 10,
                            "args": args})
        self.ts = start + 11

    def launch(self, kernel: str, at: float):
        self.corr += 1
        self.events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                         "ts": at, "dur": 3, "args": {"correlation": self.corr}},
                        {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": at + 4 + self.corr * 40,
                         "dur": 20, "args": {"correlation": self.corr, "stream": 7, "device": 0}}]


def moe_trace(path):
    w = TraceWriter()

    def gate():
        w.op("aten::mm", "ampere_sgemm_32x32_nn")
        w.op("aten::_softmax", "void (anonymous namespace)::softmax_warp_forward<float, float, float, 3>(float*)")
        w.op("aten::topk", "void at::native::sbtopk::gatherTopK<float, unsigned int, 2>(float*)")

    def expert():
        w.op("aten::mm", "ampere_sgemm_64x64_nn")
        w.op("aten::gelu", "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>(int)")

    def moe():
        w.frame("nn.Module: SwitchGate_0", gate)
        w.frame("nn.Module: FeedForward_0", expert)
        w.op("aten::scatter_", "void at::native::_scatter_gather_elementwise_kernel<128, 4>(int)")

    def norm():
        w.op("aten::pow", "void at::native::vectorized_elementwise_kernel<4, pow_tensor_scalar_kernel>(int)")
        w.op("aten::mul", "void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)", seq=41)

    def step():
        w.frame("nn.Module: LlamaRMSNorm_0", norm)
        w.frame("nn.Module: SwitchMoE_0", moe)
        w.op("aten::mul", "void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)", seq=42)
        w.frame("autograd::engine::evaluate_function: MulBackward0",
                lambda: w.op("aten::mul", "void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)"),
                cat="cpu_op")
        w.events[-1]["args"] = {"Sequence number": 41}  # the backward node of the norm's mul
        # Outside any op: a Triton-style launch from Python, an exchange kernel, and the host waiting.
        w.launch("void vllm::moe::topkGatingSoftmax<8, 8>(float const*)", w.ts)
        w.launch("void mylib::ep::internode::combine<true, 8>(int4*, float*)", w.ts + 4)
        w.ts += 10
        w.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1,
                         "ts": w.ts, "dur": 50})
        w.ts += 60

    w.frame("ProfilerStep#0", step, cat="user_annotation")
    path.write_text(json.dumps({"traceEvents": w.events}))
    return path


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    t = analyze_time(load_trace(moe_trace(tmp_path_factory.mktemp("ctx") / "moe.json")))
    return t.by_name


def category(by_name, resource: str, name: str) -> set[str]:
    rows = by_name[(by_name.resource == resource) & by_name.name.str.contains(name, regex=False)]
    return set(rows.category)


@pytest.mark.parametrize("resource,name,expected", [
    ("cpu", "aten::_softmax", {"moe_routing"}),  # a router's softmax, inside the gate module
    ("cpu", "aten::topk", {"moe_routing"}),
    ("gpu", "gatherTopK", {"moe_routing"}),  # the kernel takes its launching op's context
    ("cpu", "aten::scatter_", {"moe_routing"}),  # permuting tokens inside the MoE block
    ("cpu", "aten::gelu", {"elementwise"}),  # an expert's activation: its module stops the MoE context
    ("gpu", "ampere_sgemm", {"gemm"}),  # the gate's and the expert's GEMMs stay GEMMs
    ("cpu", "aten::pow", {"norm"}),  # elementwise ops in an RMSNorm module
    ("gpu", "topkGatingSoftmax", {"moe_routing"}),  # no launching op: the kernel's function decides
    ("gpu", "mylib::ep::internode::combine", {"communication"}),  # expert-parallel exchange, any library
    ("cpu", "cudaDeviceSynchronize", {"idle"}),  # the host waiting for the GPU outside any op
])
def test_context_and_function_decide(moe, resource, name, expected):
    assert category(moe, resource, name) == expected


def test_a_backward_node_takes_its_forward_ops_layer(moe):
    """Two muls with kernels of one name: the norm's (sequence number 41) and one outside any layer (42). The
    backward node of 41 runs outside every module, yet is norm work; the mul outside any layer stays elementwise."""
    muls = moe[(moe.resource == "cpu") & (moe.name == "aten::mul")]
    # Each mul's self time: 10 µs less its kernel launch's 3.
    assert muls.groupby("category").seconds.sum().to_dict() == pytest.approx({"norm": 14e-6, "elementwise": 7e-6})


@pytest.mark.parametrize("name,expected", [
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)", "dispatch"),
    ("void (anonymous namespace)::store_kvcache<2048l, 4, true, long>((anonymous namespace)::StoreKVCacheParams)",
     "store_kvcache"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
     "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    ("aten::dispatch_stub", "dispatch_stub"),
    ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64", "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64"),
])
def test_kernel_function_is_the_name_without_types_and_namespaces(name, expected):
    assert kernel_function(name) == expected


@pytest.mark.parametrize("frame,expected", [
    ("nn.Module: Qwen3MoeSparseMoeBlock_3", "moe_routing"), ("nn.Module: GptOssTopKRouter_0", "moe_routing"),
    ("nn.Module: Qwen3MoeExperts_0", "compute"), ("nn.Module: LlamaRMSNorm_2", "norm"),
    ("nn.Module: RotaryEmbedding_0", "attention"), ("nn.Module: VocabParallelEmbedding_0", "embedding_loss"),
    ("nn.Module: QKVParallelLinear_0", "compute"), ("nn.Module: Sequential_0", None),
    ("nn.Module: LlamaDecoderLayer_5", None), ("profkit/norm", "norm"), ("Optimizer.step#AdamW.step", None),
])
def test_what_a_layer_says_it_is(frame, expected):
    assert context_of(frame) == expected


def test_a_counter_mode_trace_says_its_gpu_side_has_no_timing(tmp_path):
    """CUPTI range-profiler traces hold ``cuda_profiler_range`` events (counters of replayed kernels), no
    ``kernel`` events: the host side is analysed and a note says why the GPU side is not."""
    w = TraceWriter()
    w.frame("ProfilerStep#0", lambda: w.op("aten::mm"), cat="user_annotation")
    w.events.append({"ph": "X", "cat": "cuda_profiler_range", "name": "ampere_sgemm_64x64_nn", "pid": 0, "tid": 7,
                     "ts": 2, "dur": 1, "args": {"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 1024}})
    (tmp_path / "counters.json").write_text(json.dumps({"traceEvents": w.events}))
    t = analyze_time(load_trace(tmp_path / "counters.json"))
    assert t.gpu_window_s is None and t.coverage("cpu") == 1.0
    assert any("CUPTI counter mode: its 1 kernel ranges carry performance counters" in n for n in t.notes)
