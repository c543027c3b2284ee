"""The category rule table, row by row: for every rule, real names (from traces recorded on real GPUs and
CPUs) that it must match and real names that it must not. Then the whole table on the real GPU fixtures."""

import pytest

from profkit.analyze import breakdown
from profkit.analyze.categories import RULES, by_name
from tests.conftest import GPU_TRACES

# (name as it appears in a trace, the category it must get)
MUST = [
    # communication
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("c10d::allreduce_", "communication"),
    ("record_param_comms", "communication"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*)", "communication"),
    ("void deep_ep::internode::combine<false, 2, 4, 768, 8>(nv_bfloat16*, float*, bool*)", "communication"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int)", "communication"),
    ("nvshmemi_proxy_progress_kernel", "communication"),
    ("mscclKernel_Sum_half_Simple_false(ncclDevComm*, mscclAlgo*, mscclWork*)", "communication"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "communication"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, true>(tensorrt_llm::kernels::AllReduceParams)", "communication"),
    ("gloo:all_reduce", "communication"),
    # quantization
    ("bitsandbytes::dequantize_4bit", "quantization"),
    ("void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>(float*, unsigned char*, float*, __nv_bfloat16*, int, int)", "quantization"),
    ("void vllm::scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, long)", "quantization"),
    ("void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_gpu_kernel<float>(unsigned char const*, int, int, float*)", "quantization"),
    ("void at::native::(anonymous namespace)::per_token_group_quant_8bit_kernel<c10::BFloat16, c10::Float8_e4m3fn>", "quantization"),
    # moe_routing (vLLM's CUDA kernels, by their function names in its csrc/moe)
    ("void vllm::moe::topkGatingSoftmax<8, 8, 4, 16, 32, int, float>(float const*, bool const*, float*, int, int*, int*, int, int, int)", "moe_routing"),
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)", "moe_routing"),
    ("void vllm::moe::count_and_sort_expert_tokens_kernel<int>(int const*, int*, int*, unsigned long)", "moe_routing"),
    ("void vllm::moe::moe_sum_kernel<c10::BFloat16, 2>(c10::BFloat16*, c10::BFloat16 const*, int)", "moe_routing"),
    # attention
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>>", "attention"),
    ("attn_fwd", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, int, int, int, bool const*, int, bool)", "attention"),
    ("void at::native::(anonymous namespace)::transform_bias_rescale_qkv_kernel<float, float, true>(at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, long>)", "attention"),
    ("void (anonymous namespace)::store_kvcache<2048l, 4, true, long>((anonymous namespace)::StoreKVCacheParams)", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*)", "attention"),
    # embedding_loss
    ("aten::mse_loss", "embedding_loss"),
    ("void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1", "embedding_loss"),
    ("aten::nll_loss_forward", "embedding_loss"),
    ("aten::embedding_dense_backward", "embedding_loss"),
    # norm
    ("aten::native_layer_norm", "norm"),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, cudnnTensorStruct, float const*)", "norm"),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float, float>(long, float, float const*, float*, float*)", "norm"),
    # gemm
    ("aten::mm", "gemm"),
    ("fused_moe_kernel", "gemm"),  # vLLM's Triton kernel: the experts' grouped GEMM
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm"),
    ("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128_cublasLt", "gemm"),  # an FP8 GEMM is a GEMM
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4::Params)", "gemm"),
    ("Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1", "gemm"),
    ("volta_sgemm_128x64_nn", "gemm"),
    ("nvjet_tst_128x128_64x4_1x2_h_bz_coopA_NTN", "gemm"),
    # convolution
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "convolution"),
    ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int)", "convolution"),
    ("aten::cudnn_convolution", "convolution"),
    # optimizer
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>>", "optimizer"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<5>, LAMBStage1Functor<float>>", "optimizer"),
    # memcpy_memset
    ("Memcpy HtoD (Pageable -> Device)", "memcpy_memset"),
    ("Memset (Device)", "memcpy_memset"),
    ("aten::copy_", "memcpy_memset"),
    ("aten::ones_like", "memcpy_memset"),
    ("__amd_rocclr_fillBufferAligned", "memcpy_memset"),
    # elementwise
    ("aten::silu", "elementwise"),
    ("aten::normal_", "elementwise"),
    ("void bounds_check_indices_kernel<long>(at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, int>)", "elementwise"),
    ("aten::_foreach_add_", "elementwise"),  # how it is done, not what for: the optimizer is found by context
    ("aten::isin", "elementwise"),  # generate()'s stopping criteria, every token
    ("aten::__and__", "elementwise"),
    ("aten::__or__", "elementwise"),
    ("aten::logical_not", "elementwise"),
    ("aten::resolve_conj", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>>(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", "elementwise"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()>, unsigned int, float, 4>>", "elementwise"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, unsigned int>::Policy900, false, long, int, int>", "elementwise"),
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, long>(int, int, int, int const*, int const*, int const*)", "elementwise"),
    ("void at::native::(anonymous namespace)::adaptive_average_pool<float>(float const*, float*, int, int, int, int, long, long, long)", "elementwise"),
]

# (name, the category it must NOT get): names that once fell into a rule they do not belong to
MUST_NOT = [
    ("torch/_ops.py(1002): <lambda>", "optimizer"),  # 'lamb' in a Python frame's lambda
    ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2>>", "optimizer"),
    ("void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, long const*, float*, long, long, long)", "gemm"),  # fbgemm library, no GEMM
    ("fbgemm::permute_pooled_embs", "gemm"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>", "communication"),
    ("sm90_xmma_gemm_e4m3e4m3_bf16f32_f32_tn_n_tilesize128x128x128_cublasLt", "quantization"),
    ("aten::dispatch_stub", "communication"),  # 'dispatch' alone is not DeepEP's dispatch
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&)::{lambda(int)#1}>(long, at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&)::{lambda(int)#1})", "communication"),
    ("aten::topk", "moe_routing"),  # top-k alone is not routing: inside a router's module it is (context)
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, int, int, int, bool const*, int, bool)", "moe_routing"),
    ("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<float, float, unsigned int, 1, 4, bool>", "attention"),
    ("aten::linear", "elementwise"),
    ("aten::_foreach_mul_", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 3, 2, 0>, std::plus<float>, float>", "optimizer"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase&, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::MulFunctor<float>> const&)::{lambda(int)#1}>", "optimizer"),
]


@pytest.mark.parametrize("name,category", MUST)
def test_rule_matches(name, category):
    assert by_name(name) == category


@pytest.mark.parametrize("name,category", MUST_NOT)
def test_rule_does_not_match(name, category):
    assert by_name(name) != category


def test_every_rule_has_rows_both_ways():
    rules = {cat for cat, _ in RULES}
    assert rules <= {c for _, c in MUST}
    assert len(MUST_NOT) >= 8


REAL = sorted(p for p in GPU_TRACES.glob("*.json.gz") if "memory_timeline" not in p.name)


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    return breakdown(REAL)


@pytest.mark.parametrize("trace", [p.name for p in REAL])
def test_real_gpu_traces_are_analysed_and_covered(real, trace):
    run = trace.removesuffix(".json.gz")
    row = real.runs.set_index("run").loc[run]
    assert row.status == "foreign" and not [p for p in real.problems if p.path.name == trace]
    assert row.coverage_gpu >= 0.95 and row.coverage_cpu >= 0.95


def test_python_frames_never_decide_a_category(real):
    """H100 inference trace recorded with stacks: nothing is optimizer work, though Python frames named
    ``<lambda>`` launch many elementwise kernels."""
    t = real.time[real.time.run == "h100_qwen1.5-0.5b_hf_memory"]
    assert t[t.category == "optimizer"].seconds.sum() == 0
    assert t[(t.resource == "gpu") & (t.category == "elementwise")].seconds.sum() > 0.005


def test_the_2021_schema_is_read(real):
    """Kineto's 2021 names (Operator, Runtime, Kernel, Memcpy, Memset; steps as Operator) give the same kind
    of breakdown as today's."""
    run = "v100_resnet50_kineto2021_memory"
    t = real.time[real.time.run == run]
    assert real.runs.set_index("run").loc[run].profiled_steps >= 1
    gpu = t[t.resource == "gpu"].groupby("category").seconds.sum()
    assert gpu["convolution"] > gpu.drop(["convolution", "idle"]).max()  # ResNet-50: convolution first
    assert {"forward", "backward", "optimizer"} <= set(t.phase)


def test_lowered_rules_equal_case_insensitive_matching():
    """by_name lowers the name once instead of matching with re.IGNORECASE: the same answer for every distinct
    name in the real traces."""
    import re

    from profkit.analyze.categories import _EXCHANGE, kernel_function
    from profkit.analyze.trace import load_trace

    rules = [(cat, re.compile(rx, re.IGNORECASE)) for cat, rx in RULES]
    names = {n for p in REAL for n in load_trace(p).names} | {n for n, _ in MUST + MUST_NOT}
    for name in names:
        exchange = _EXCHANGE.fullmatch(kernel_function(name).lower())  # decided before the table
        expected = "communication" if exchange else next((cat for cat, rx in rules if rx.search(name)), None)
        assert by_name(name) == expected, name
