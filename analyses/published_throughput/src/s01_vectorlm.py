from common import R
SRC = "VectorInstitute/vectorlm:docs/reference_throughput.md@9045f08ac1af38c13100cfabdd17412f57dbffd2"
data = {
 ("full",1): [(2048,8,3550.48),(4096,4,3461.64),(8192,2,3204.21)],
 ("full",2): [(2048,8,6346.00),(4096,4,6182.59),(8192,2,5772.91)],
 ("full",4): [(2048,8,12688.44),(4096,4,12249.74),(8192,2,11463.46)],
 ("lora",1): [(2048,8,4079.28),(4096,4,3682.15),(8192,2,3528.93)],
 ("lora",2): [(2048,8,7182.97),(4096,4,6955.58),(8192,2,6452.96)],
 ("lora",4): [(2048,8,14299.47),(4096,4,13834.43),(8192,2,12769.23)],
}
for (m,n), lst in data.items():
    for seq,bs,v in lst:
        lab = "full_rank" if m=="full" else "lora"
        R(source=SRC, quote=f"| ({lab}) NVIDIA A100-SXM4-80GB x{n} | ... Meta-Llama-3-8B ({seq}): {v:.2f} (batch: {bs}) |",
          model="meta-llama/Meta-Llama-3-8B", gpu="NVIDIA A100-SXM4-80GB", n_gpus=n, method=m,
          gc="yes", sharding="fsdp", offload="none", precision="mixed", batch_per_device=bs, grad_accum=4,
          seq_len=seq, packing="yes", lora_rank=(8 if m=="lora" else ""), lora_targets=("unstated" if m=="lora" else ""),
          attention="unstated", framework="vectorlm (PyTorch FSDP)", measured=v, unit="tokens/s",
          what_counted="median training throughput in tokens/second across all training steps, aggregated across all GPU devices (doc wording); benchmark.py counts len(input_ids.flatten())*world_size per step",
          notes="Doc @9045f08 (2024-05-28, current): 'For each context width and hardware configuration, we experiment with a per-device batch size of 2, 4, and 8. In the table below, we report the batch size that maximizes training throughput. All values ... represent the median training throughput in tokens/second across all training steps, aggregated across all GPU devices'; 'In experiments labelled as LoRA, we set hidden dimension to 8'; environment pip freeze lists torch==2.2.1 and flash-attn==2.5.8 (so flash attention was installed; whether used is not stated). Vaughan cluster. An intermediate version (0703e07, 2024-05-09) has the same numbers but says 'batch size of 8', torch 2.2.2. From profiling/configs/benchmark.yaml & lora-benchmark.yaml @9045f08 (not restated in doc): FSDP FULL_SHARD, use_mp True (mixed precision; dtype not named in yaml), use_activation_checkpointing True, gradient_accumulation_steps 4, packing_type partial (gsm8k-question data); yaml comment 'use_flash_attention is automatically enabled for CUDA capability > 8.0' (A100 is 8.0, so unclear). LoRA r=8, alpha 32, target modules not set in yaml (PEFT default for Llama would be q_proj,v_proj - inferred, not stated). Benchmark uses trainer.train_step (no eval overhead). GC/sharding/grad_accum/packing filled from config, not the doc table.")
