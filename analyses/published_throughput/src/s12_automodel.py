from common import R
SRC = "NVIDIA-NeMo/Automodel:docs/performance-summary.mdx@36044ad3d139363fb6c73c24af2e7c6b65ec52f6"
N = ("Section 'Fine-Tuning (LoRA) Performance', 'System: DGX-H100, Precision: BF16', 'full sequences with no padding'; notes: 'All benchmarks use mock data', 'No gradient clipping', "
     "'MFU calculated using peak TFLOPs ... 989 for BF16 H100', 'Step times include forward and backward passes and optimizer step for the global batch'; Last Updated 2025-10-02 (table rows added by 2025-12-16, commit 507bfb75). "
     "Benchmark YAMLs (examples/llm_benchmark/*peft_benchmark.yaml @HEAD, may have changed since the run): LoRA dim 16, alpha 32, target_modules '*_proj' (all q,k,v,o,gate,up,down), use_triton true, "
     "MockIterableDataset seq_len 4096, AdamW, FSDP2, max_steps 10 with benchmark warmup_steps 5. Kernel optimizations: TE (Transformer Engine RMSNorm/Linear/DotProductAttention) + triton LoRA kernels.")
T = [("Llama3 8B","meta-llama/Llama-3.1-8B",1,32,2,16,1,1,10.51,402,12472.87,"llama3_1/llama3_1_8b_peft_benchmark.yaml (no activation_checkpointing key)","unstated"),
     ("Qwen2.5 7B","Qwen/Qwen2.5-7B",1,32,2,16,1,1,9.29,423,14110.05,"qwen/qwen2_5_7b_peft_benchmark.yaml (no activation_checkpointing key)","unstated"),
     ("Llama3 70B","meta-llama/Llama-3.3-70B-Instruct",8,32,2,4,2,4,15.00,316,1091.85,"llama3_3/custom_llama3_3_70b_instruct_peft_benchmark.yaml: tp_size 2, activation_checkpointing true, fsdp2_prefetch","yes"),
     ("Qwen2.5 32B","Qwen/Qwen2.5-32B-Instruct",8,32,2,4,2,4,7.28,301,2250.31,"qwen/custom_qwen2_5_32b_peft_benchmark.yaml: tp_size 2, activation_checkpointing true, fsdp2_prefetch","yes")]
for name, hf, n, gbs, lbs, ga, tp, fsdp, step, tfl, tps, cfg, gc in T:
    R(source=SRC, quote=f"| {name} | {n} | {gbs} | {lbs} | {lbs} | {ga} | 4096 | TP {tp} | ... | FSDP {fsdp} | ... | {step} | {tfl} | {tps} |", model=hf, gpu="NVIDIA H100 80GB (DGX-H100)",
      n_gpus=n, method="lora", gc=gc, sharding="fsdp", offload="none", precision="bf16", batch_per_device=lbs, grad_accum=ga, seq_len=4096, packing="yes",
      lora_rank=16, lora_targets="all *_proj (q,k,v,o,gate,up,down)", attention="unstated", framework="NeMo AutoModel (PyTorch FSDP2 + Transformer Engine)", measured=tps,
      unit="tokens/s/gpu", what_counted=f"Tokens/sec/GPU column (also: Time per Global Step {step} s for GBS {gbs}, Model TFLOPs/sec/GPU {tfl})",
      notes=f"Config {cfg}. TP={tp}, FSDP={fsdp}{' (DP=4, TP=2 on 8 GPUs)' if n==8 else ''}. packing=yes means full mock sequences with no padding. Attention via TE DotProductAttention (backend not named). " + N)
