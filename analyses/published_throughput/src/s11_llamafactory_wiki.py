from common import R
SRC = "https://github.com/hiyouga/LLaMA-Factory/wiki/Performance-comparison"
N1 = ("Wiki page 'Performance Comparison' (edited Apr 15, 2024; read via the docs corpus). Bullets after the first two tables: 'TGS: tokens per GPU per second; Model: LLaMA2-7B; Batch size: 4; Gradient accumulation: 2; LoRA rank: 8; LoRA modules: all; Max length: 1024'. "
      "The GPU is not in those bullets; the same first table quoted in unslothai/unsloth README (@0a2c3973) says 'GPU: NVIDIA A100 * 1'. Dataset, precision, GC, packing not stated (LLaMA-Factory defaults then: bf16/fp16 auto, GC on, no packing for SFT - not stated here). "
      "Whether TGS counts padding tokens is not stated.")
T1 = [("HF",16,2392,"lora","HF Transformers (LLaMA-Factory, no FA2)","unstated"),("HF+FA2",16,2954,"lora","HF Transformers + FlashAttention-2 (LLaMA-Factory)","flash"),
      ("Unsloth+FA2",16,4007,"lora","LLaMA-Factory + unsloth + FA2","flash"),("HF",4,2415,"qlora","HF Transformers + bnb 4-bit (LLaMA-Factory)","unstated"),
      ("Unsloth+FA2",4,3726,"qlora","LLaMA-Factory + unsloth + FA2 (4-bit)","flash")]
for meth, bits, v, m, fw, attn in T1:
    R(source=SRC, quote=f"| {meth} | {bits} | {v:,} | ... |", model="meta-llama/Llama-2-7b-hf (wiki: LLaMA2-7B)", gpu="NVIDIA A100 (size not stated; 'A100 * 1' per unsloth README quote)",
      n_gpus=1, method=m, gc="unstated", sharding="none", offload="none", precision="unstated", batch_per_device=4, grad_accum=2, seq_len=1024, packing="unstated",
      lora_rank=8, lora_targets="all", attention=attn, framework=fw, measured=v, unit="tokens/s/gpu", what_counted="TGS: tokens per GPU per second",
      notes=f"First table, row '{meth} | {bits} bits'. 4-bit quantization type not stated (bitsandbytes; NF4 is LLaMA-Factory's default quant type - inferred). " + N1)
T2 = [("HF",16,2155,"unstated"),("HF+FA2",16,2556,"flash"),("Unsloth+FA2",16,3400,"flash")]
for meth, bits, v, attn in T2:
    R(source=SRC, quote=f"(second table) | {meth} | {bits} | {v:,} | ... |", model="meta-llama/Llama-2-7b-hf (wiki: LLaMA2-7B)", gpu="unstated",
      n_gpus="unstated", method="lora", gc="unstated", sharding="unstated", offload="unstated", precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated",
      lora_rank="unstated", lora_targets="unstated", attention=attn, framework=("LLaMA-Factory + unsloth + FA2" if "Unsloth" in meth else "HF Transformers (LLaMA-Factory)"), measured=v, unit="tokens/s/gpu", what_counted="TGS: tokens per GPU per second",
      notes="Second table on the wiki page, directly before the bullet list; it has the same column layout but larger VRAM (29/28/27GB), so its settings differ from the first table and are NOT stated - the bullet list may or may not apply. Use with care. " + N1)
N3 = ("Third/fourth tables (context-length sweep): 'TGS: tokens per GPU per second; GPU: NVIDIA A100 40GB * 1; Model: LLaMA2-7B; Batch size: 1; Gradient accumulation: 4; LoRA rank: 8; LoRA modules: all; Quantization bit: 4'. "
      "So these are 4-bit QLoRA runs (quant type not stated). Precision, GC, dataset and whether sequences are padded/filled to the stated length are not stated.")
L = [1024,2048,4096,8192,16384,32768,65536,100000]
FA = [2295,2741,2926,3128,3542,2216,None,None]
US = [2556,3178,3413,3632,4050,2456,1820,1202]
for name, vals, fw in [("FlashAttention2",FA,"LLaMA-Factory (HF + bnb 4-bit + FA2)"),("Unsloth+FA2",US,"LLaMA-Factory + unsloth + FA2")]:
    for sl, v in zip(L, vals):
        if v is None: continue
        R(source=SRC, quote=f"TGS | {name} | {sl:,}: {v:,}", model="meta-llama/Llama-2-7b-hf (wiki: LLaMA2-7B)", gpu="NVIDIA A100 40GB", n_gpus=1, method="qlora",
          gc="unstated", sharding="none", offload="none", precision="unstated", batch_per_device=1, grad_accum=4, seq_len=sl, packing="unstated", lora_rank=8, lora_targets="all",
          attention="flash", framework=fw, measured=v, unit="tokens/s/gpu", what_counted="TGS: tokens per GPU per second", notes=N3)
