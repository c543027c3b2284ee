from common import R
SRC = "modelscope/ms-swift:docs/source_en/LLM/Benchmark.md@cdb169b781c22dd06ef03e06209819ec1f4208eb"
BASE = ("Doc env: A100 (variant not stated), CUDA 11.8, torch 2.1.1, flash_attn 2.3.4. Common args: dataset cls-fudan-news-zh "
        "(qwen-tokenizer length 3234.4+-2547.5, min 91, max 19548), save_strategy no. Defaults unless varied: max_length 2048, batch_size 1, "
        "gradient_checkpointing true, use_flash_attn true, lora_rank 8, lora_target_modules DEFAULT, quantization_bit 0, gradient_accumulation_steps 16. "
        "Speed = HF Trainer train_samples_per_second (scripts/benchmark/test_memory_time/run_single.py); that script uses the full dataset when max_length<=2048 and only 1000 samples when max_length>2048. "
        "Samples are truncated to max_length, not packed (packing not mentioned; swift default then was no packing - inferred); at max_length<=2048 most samples are truncated to max_length (mean length 3234), longer max_length gives variable lengths. "
        "Precision not stated (swift picks bf16 on A100 by default - inferred). LoRA alpha default 32 (swift default, inferred).")
FW = "ms-swift (swift sft, HF Trainer)"
def row(model, method, ml, v, quote, n=1, gc="yes", attn="flash", bs=1, ga=16, rank=None, targets=None, extra="", shard="none"):
    R(source=SRC, quote=quote, model=model, gpu="A100 (80GB implied by memory figures)", n_gpus=n, method=method, gc=gc, sharding=shard,
      offload="none", precision="unstated", batch_per_device=bs, grad_accum=ga, seq_len=ml, packing="unstated",
      lora_rank=(rank if method!="full" else ""), lora_targets=(targets if method!="full" else ""), attention=attn,
      framework=FW, measured=v, unit="samples/s", what_counted="HF Trainer train_samples_per_second (max_length = truncation length; samples not padded to it)",
      notes=(extra+" " if extra else "")+BASE)
TWO = "Marked '(2*A100)' in doc with per-GPU memory like '73.71+78.54' (unequal), consistent with swift's device_map model parallel across 2 GPUs rather than DDP (inferred, not stated)."
HF = {"qwen-1_8b-chat":"Qwen/Qwen-1_8B-Chat","qwen-7b-chat":"Qwen/Qwen-7B-Chat","qwen-14b-chat":"Qwen/Qwen-14B-Chat","qwen-72b-chat":"Qwen/Qwen-72B-Chat",
      "chatglm3-6b":"THUDM/chatglm3-6b","yi-6b-chat":"01-ai/Yi-6B-Chat","yi-34b-chat":"01-ai/Yi-34B-Chat","openbuddy-zephyr-7b-chat":"OpenBuddy/openbuddy-zephyr-7b-v14.1 (swift model_type openbuddy-zephyr-7b-chat)",
      "baichuan2-7b-chat":"baichuan-inc/Baichuan2-7B-Chat","baichuan2-13b-chat":"baichuan-inc/Baichuan2-13B-Chat"}
DT = "DEFAULT (swift per-model default, e.g. c_attn for qwen)"
lora = {
 "qwen-1_8b-chat":[9.88,9.90,8.77,5.92,4.19],
 "qwen-7b-chat":[7.43,6.51,4.31,2.05,1.34],
 "qwen-14b-chat":[5.63,4.36,2.60,1.17,0.79],
 "qwen-72b-chat":[1.41,1.02,0.59,None,None],
 "chatglm3-6b":[6.72,6.16,4.20,1.92,1.24],
 "yi-6b-chat":[5.27,5.07,3.84,1.99,1.35],
 "yi-34b-chat":[2.32,1.76,1.05,0.47,0.31],
 "openbuddy-zephyr-7b-chat":[5.17,3.92,3.08,1.85,0.92],
 "baichuan2-7b-chat":[6.09,5.36,3.43,1.69,1.16],
 "baichuan2-13b-chat":[5.32,3.91,1.77,0.65,0.36],
}
for mt, vals in lora.items():
    for ml, v in zip([512,1024,2048,4096,8192], vals):
        if v is None: continue
        two = (mt=="qwen-72b-chat") or (mt=="yi-34b-chat" and ml==8192)
        extra = "Table 'Model Type & Max Length / LoRA'." + (" "+TWO if two else "")
        if mt=="qwen-7b-chat" and ml==2048: extra += " This is the all-defaults configuration; the same 4.31 appears in the Quantization (bf16), Batch Size (1), FlashAttn/GC (both on) and LoRA rank (8 DEFAULT) tables - recorded once here."
        row(HF[mt], "lora", ml, v, f"{mt} [LoRA] | Max Length {ml} | {v} samples/s" + (" (2*A100)" if two else ""), n=2 if two else 1, rank=8, targets=DT, extra=extra, shard="unstated" if two else "none")
full = {
 "qwen-1_8b-chat":[10.77,10.39,8.73,5.45,3.81],
 "qwen-7b-chat":[5.96,5.00,3.30,1.64,1.11],
 "qwen-14b-chat":[3.66,2.98,1.93,0.92,0.62],
}
for mt, vals in full.items():
    for ml, v in zip([512,1024,2048,4096,8192], vals):
        two = (mt=="qwen-14b-chat") or (mt=="qwen-7b-chat" and ml==8192)
        extra = "Table 'Model Type & Max Length / Full'. Optimizer not stated (HF Trainer default AdamW, inferred)." + (" "+TWO if two else "")
        row(HF[mt], "full", ml, v, f"{mt} [FULL] | Max Length {ml} | {v} samples/s" + (" (2*A100)" if two else ""), n=2 if two else 1, extra=extra, shard="unstated" if two else "none")
for bs, v in [(2,3.60),(4,3.02),(8,2.77)]:
    row(HF["qwen-7b-chat"], "lora", 2048, v, f"qwen-7b-chat [LoRA] | Batch Size {bs} | {v}", bs=bs, rank=8, targets=DT, extra="Table 'Batch Size' (gradient_accumulation_steps stays 16).")
for fa, gc, v in [(True,False,6.19),(False,True,3.13),(False,False,4.45)]:
    row(HF["qwen-7b-chat"], "lora", 2048, v, f"qwen-7b-chat [LoRA] | use_flash_attn {'Y' if fa else 'N'} | gradient_checkpointing {'Y' if gc else 'N'} | {v}",
        gc="yes" if gc else "no", attn="flash" if fa else "unstated", rank=8, targets=DT,
        extra="Table 'Use Flash Attn & Gradient Checkpointing'." + ("" if fa else " Without flash attn the attention implementation is not named (Qwen v1 remote code falls back to its own eager attention - inferred)."))
for r, t, v in [(2,"DEFAULT (c_attn)",4.27),(64,"DEFAULT (c_attn)",4.19),(8,"ALL (all linear)",3.22)]:
    row(HF["qwen-7b-chat"], "lora", 2048, v, f"qwen-7b-chat [LoRA] | LoRA Rank {r} | {t} | {v}", rank=r, targets=t, extra="Table 'LoRA Rank & LoRA Target Modules'.")
for ga, v in [(1,4.26),(2,4.32),(4,4.31),(8,4.32),(16,4.33),(32,4.30),(64,4.32)]:
    row(HF["qwen-7b-chat"], "lora", 2048, v, f"qwen-7b-chat [LoRA] | Gradient Accumulation Steps {ga} | {v}", ga=ga, rank=8, targets=DT, extra="Table 'Gradient Accumulation Steps' (separate runs; GA 16 = default but measured 4.33 here).")
for q, v in [("int4 (bnb)",2.41),("int4 (gptq)",2.05),("int8 (gptq)",1.97)]:
    for mt, vv in []: pass
qt = {"qwen-7b-chat":[("int4 (gptq)",2.05),("int8 (gptq)",1.97),("int4 (bnb)",2.41)],
      "qwen-14b-chat":[("int4 (gptq)",1.15),("int8 (gptq)",1.08),("int4 (bnb)",1.36)],
      "qwen-72b-chat":[("int4 (gptq)",0.23),("int8 (gptq)",0.21),("int4 (bnb)",0.28)]}
for mt, lst in qt.items():
    for q, v in lst:
        note = ("Table 'Quantization'. Base quantized with " + ("bitsandbytes 4-bit (bnb_4bit_quant_type/double-quant not stated; swift defaults then were nf4 + double quant - inferred)" if "bnb" in q else
                "GPTQ ("+q+") via auto_gptq 0.5.1 - NOT bnb NF4; method column 'qlora' means LoRA on a quantized base") + ".")
        if mt=="qwen-72b-chat": note += " Single A100 (the bf16 72B row in the same table is marked 2*A100, the quantized rows are not)."
        row(HF[mt], "qlora", 2048, v, f"{mt} [LoRA] | Quantization {q} | {v} samples/s", rank=8, targets=DT, extra=note)
# Tuners table (ms-agent dataset, 2 epochs)
TN = ("Table 'Tuners' (exp config scripts/benchmark/config/tuner.json @cdb169b): model qwen-7b-chat, dataset ms-agent with ms-bench mix ratio 2.0 (mix 0.0 for *no_mix*), "
      "batch_size 1, max_length 2048, gradient_accumulation_steps 16, num_train_epochs 2, eval_steps 2000 / save_steps 2000 (so wall time includes periodic eval+save), "
      "val_dataset_sample 5000, flash_attn True, gradient_checkpointing True, 1 GPU (ddp 1) unless noted. Speed = samples/seconds of the whole run as printed in the cell. GPU: doc-wide 'A100'.")
def trow(name, method, v, cell, n=1, pack="no", rank="", targets="", extra=""):
    R(source=SRC, quote=f"|{name}|qwen-7b-chat|...|train speed {cell}|", model="Qwen/Qwen-7B-Chat", gpu="A100 (variant not stated)", n_gpus=n, method=method,
      gc="yes", sharding=("ddp" if n>1 else "none"), offload="none", precision="unstated", batch_per_device=1, grad_accum=16, seq_len=2048, packing=pack,
      lora_rank=rank, lora_targets=targets, attention="flash", framework=FW, measured=v, unit="samples/s",
      what_counted="train samples / total train seconds over 2 epochs, as printed (e.g. '87543 samples/61022.97 seconds')", notes=(extra+" " if extra else "")+TN)
trow("full", "full", 1.43, "1.43(87543 samples/61022.97 seconds)", extra="memory 73.53GiB.")
trow("full+no_mix", "full", 1.27, "1.27(29698 samples/23356.97 seconds)", extra="mix ratio 0.0; memory 72.56GiB.")
trow("lora", "lora", 0.95, "0.95(87543 samples/91974.29 seconds)", rank=8, targets="ALL (all linear)", extra="LoRA alpha 32; memory 32.35GiB. Note: slower than full in this table (source's own figures).")
trow("lora+no_mix", "lora", 0.91, "0.91(29698 samples/32570.15 seconds)", rank=8, targets="ALL (all linear)", extra="mix ratio 0.0.")
trow("lora+packing", "lora", 0.79, "0.79(7900 samples/10048.53 seconds)", pack="yes", rank=8, targets="ALL (all linear)", extra="packing=True: a 'sample' is a packed 2048-token sequence (7900 packed samples).")
trow("lora+packing+ddp", "lora", 1.56, "1.56(7900 samples/5057.30 seconds)", n=2, pack="yes", rank=8, targets="ALL (all linear)", extra="2 GPUs DDP (tuner.json requirements gpu 2, ddp 2); memory 35.65GiB*2; samples counted globally.")
trow("unsloth+lora+q4", "qlora", 1.76, "1.76(76839 samples/43763.01 seconds)", rank="unstated", targets="unstated", extra="Different model: llama3-8b-instruct (meta-llama/Meta-Llama-3-8B-Instruct) with unsloth backend, 4-bit base (bnb 4-bit via unsloth - quant type not stated); trainable params 4.7186M; memory 21.69GiB.")
import common
common.ROWS[-1]["model"] = "meta-llama/Meta-Llama-3-8B-Instruct"; common.ROWS[-1]["framework"] = "ms-swift + unsloth"
