from common import R
SRC = "AnswerDotAI/fsdp_qlora:benchmarks_03_2024.md@05ed9f2a60f96a0795cb082bceab70a9b19fd213"
TPL = ("Template command: python train.py --model_name meta-llama/Llama-2-7b-hf --batch_size 1 --context_length 512 --train_type qlora --use_gradient_checkpointing True --reentrant_checkpointing True "
       "--use_cpu_offload False --log_to wandb --dataset dummy --dataset_samples 1024; later tables change only the stated parameters. 'dummy' dataset = identical long outputs truncated to context_length, so every sample is exactly context_length tokens. "
       "Time (s) = wall time of the run (1 epoch of 1024 samples; the doc's cost note says 'training 1,024 samples at a context length of 2,048'). "
       "Benchmarks done Feb-Mar 2024. train.py defaults (@05ed9f2, may differ from the code used then): precision 'bf16' (pure bf16, non-autocast), lora_rank 64, lora_alpha 16, lora_target_modules 'all' = q,k,v,up,down,gate (no o_proj), gradient_accumulation_steps 1, sharding full_shard, attn sdpa, optimizer adamw. "
       "QLoRA = bitsandbytes 4-bit (NF4 per the Answer.AI FSDP-QLoRA posts; quant type not restated in this doc). 'DDP' rows = FSDP with sharding_strategy ddp (NO_SHARD), not torch DDP. 'CPU Offload' = FSDP CPUOffload (params, grads, optimizer step on CPU).")
R3090 = "2x RTX 3090 24GB without NVLink, power-limited to 280W, 128GB CPU RAM, older motherboard (slow PCIe lanes)."
R4090 = "2x RTX 4090 24GB, no NVLink, full PCIe v4 x16 lanes each, up to 400W per card, 128GB CPU RAM."
def row(sec, tbl, model, meth, ctx, bs, ddp, off, v, gpu, n, env, gc="yes", extra="", unit="s total", wc=None, ga=1):
    R(source=SRC, quote=tbl, model=model, gpu=gpu, n_gpus=n, method=meth, gc=gc, sharding=("ddp" if ddp else "fsdp"), offload=("params+optimizer" if off else "none"),
      precision="unstated", batch_per_device=bs, grad_accum=ga, seq_len=ctx, packing="yes", lora_rank=64, lora_targets="q,k,v,gate,up,down (train.py 'all')",
      attention="sdpa", framework="fsdp_qlora train.py (PyTorch FSDP + HF/PEFT/bnb)", measured=v, unit=unit,
      what_counted=wc or "Time (s): total wall time for one epoch of 1024 dummy samples",
      notes=f"Section: {sec}. {env} {extra} gc=yes from template command (--use_gradient_checkpointing True --reentrant_checkpointing True). " + TPL)
L7 = "meta-llama/Llama-2-7b-hf"; Y34 = "01-ai/Yi-34B"; L70 = "meta-llama/Llama-2-70b-hf"
G3 = "NVIDIA GeForce RTX 3090"; G4 = "NVIDIA GeForce RTX 4090"
S = "Dual 3090 'Basement Rig'"
row(S, "| QLoRA | 512 | 4.98 | 1,082 |", L7, "qlora", 512, 1, False, False, 1082, G3, 2, R3090, extra="The prose says 'Training also takes longer: 800 seconds vs 550' while the table gives 1,082 / 1,564 - the table values are recorded.")
row(S, "| QLoRA | 2048 | 5.21 | 1,564 |", L7, "qlora", 2048, 1, False, False, 1564, G3, 2, R3090, extra="Prose/table mismatch (800 s vs 1,564 s in table).")
row(S, "| LoRA | 512 | 10.24 | 2,597 |", L7, "lora", 512, 1, False, False, 2597, G3, 2, R3090)
row(S, "| LoRA | 2048 | 10.22 | 3,090 |", L7, "lora", 2048, 1, False, False, 3090, G3, 2, R3090)
for meth, bs, v in [("QLoRA",4,998),("QLoRA",10,936),("LoRA",4,1366),("LoRA",6,1199)]:
    row(S, f"| {meth} | {bs} | ... | {v:,} |", L7, meth.lower(), 2048, bs, False, False, v, G3, 2, R3090)
row(S, "| QLoRA | True | 8 | 20.94 | 875 |", L7, "qlora", 2048, 8, True, False, 875, G3, 2, R3090)
row(S, "| LoRA | True | 4 | 22.04 | 881 |", L7, "lora", 2048, 4, True, False, 881, G3, 2, R3090)
row(S, "| QLoRA | False | 2 | 23.05 | 5,041 | (Yi 34B)", Y34, "qlora", 2048, 2, False, False, 5041, G3, 2, R3090)
row(S, "| QLoRA | True | 4 | 22.98 | 4,830 | (Yi 34B)", Y34, "qlora", 2048, 4, False, True, 4830, G3, 2, R3090)
row(S, "| QLoRA | True | 2 | 14.92 | 11,795 | (Llama-2 70B)", L70, "qlora", 2048, 2, False, True, 11795, G3, 2, R3090, extra="Doc: 'nearly 50 seconds per batch'; 10GB swapfile needed for loading.")
S = "Dual 4090 'Budget Workstation'"
for meth, off, ddp, bs, v in [("LoRA",False,True,4,437),("LoRA",False,False,6,481),("LoRA",True,False,10,482),("QLoRA",False,True,8,450),("QLoRA",False,False,10,466),("QLoRA",True,False,12,464)]:
    row(S, f"| {meth} | {off} | {ddp} | {bs} | ... | {v} |", L7, meth.lower(), 2048, bs, ddp, off, v, G4, 2, R4090)
row(S, "| QLoRA | False | 2 | 23.05 | 2,072 | (Yi 34B)", Y34, "qlora", 2048, 2, False, False, 2072, G4, 2, R4090)
row(S, "| QLoRA | True | 4 | 22.98 | 2,061 | (Yi 34B)", Y34, "qlora", 2048, 4, False, True, 2061, G4, 2, R4090)
row(S, "| QLoRA | True | 2 | 14.92 | 4,399 | (Llama-2 70B)", L70, "qlora", 2048, 2, False, True, 4399, G4, 2, R4090)
M7 = "mistral-community/Mistral-7B-v0.2 (doc: 'Mistral 7B v0.2 Base')"
row(S, "| QLoRA | True | 12 | 2,048 | 22.54 | 483 |", M7, "qlora", 2048, 12, False, True, 483, G4, 2, R4090)
row(S, "| QLoRA | True | 1 | 24,576 | 22.54 | 7,809 |", M7, "qlora", 24576, 1, False, True, 7809, G4, 2, R4090, extra="Dataset sample count for this run not restated.")
row(S, "'...reduces the training speed from 2,200 tokens/second to 1,615 tokens/second' (context 2,048, batch 12)", M7, "qlora", 2048, 12, False, True, 2200, G4, 2, R4090,
    unit="tokens/s", wc="tokens/second stated in prose (whole job, both GPUs - not said whether per GPU)")
row(S, "'...reduces the training speed from 2,200 tokens/second to 1,615 tokens/second' (context 24,576, batch 1)", M7, "qlora", 24576, 1, False, True, 1615, G4, 2, R4090,
    unit="tokens/s", wc="tokens/second stated in prose (whole job, both GPUs - not said whether per GPU)")
S = "Recommendations for Different Hardware Configurations (Llama-2 70B QLoRA, context 2048, effective batch 32 'or the closest we could get')"
REC = [("A5000 24GB",2,True,2,9688),("A5000 24GB",4,False,1,4829),("A5000 24GB",8,False,1,2613),("A6000 Ada 48GB",2,False,2,5867),("A6000 Ada 48GB",4,False,3,2904),
       ("A100 40GB SMX",2,False,1,3277),("A100 40GB SMX",4,False,4,1266),("A100 40GB SMX",8,False,4,672),("H100 80GB SXM",4,False,8,667)]
GN = {"A5000 24GB":"NVIDIA RTX A5000 24GB","A6000 Ada 48GB":"NVIDIA RTX 6000 Ada Generation 48GB (doc: 'A6000 Ada 48GB')","A100 40GB SMX":"NVIDIA A100-SXM4-40GB (doc: 'A100 40GB SMX')","H100 80GB SXM":"NVIDIA H100 80GB SXM"}
for acc, n, off, bs, v in REC:
    R(source=SRC, quote=f"| {acc} | {n} | {off} | {bs} | {v:,} | ...", model=L70, gpu=GN[acc], n_gpus=n, method="qlora", gc="unstated", sharding="fsdp",
      offload=("params+optimizer" if off else "none"), precision="unstated", batch_per_device=bs, grad_accum="unstated", seq_len=2048, packing="unstated",
      lora_rank=64, lora_targets="q,k,v,gate,up,down (train.py 'all')", attention="sdpa", framework="fsdp_qlora train.py (PyTorch FSDP + HF/PEFT/bnb)", measured=v, unit="s total",
      what_counted="Time (s) for the run; the table's cost note refers to 'training 1,024 samples at a context length of 2,048'",
      notes=f"Section: {S}. 'CPU+Activation Offload' column = {off} (True means both FSDP CPU offload and activation offload). Settings chosen as 'the fastest possible combination of settings'; grad accumulation, GC and dataset not stated (effective batch 32 target). " + TPL)
