from common import R
SRC = "NVIDIA/NeMo:docs/source/performance/performance_summary.md@8e3d65dcfe"
N = ("Section 'Finetuning': 'finetuning performance of LLAMA2 models with SFT (supervised fine-tuning), and LoRA (Low-rank adaptors) at FP8 precision', Container NeMo24.07, System DGX-H100; "
     "'For fine-tuning, we use SQuAD-v1.1 dataset, and the inputs are packed to 4096 tokens'. Commit 8e3d65dc (2024-09-09, '24.07 perf numbers'); an earlier version (commit 3a8081fe, vboost) had slightly different numbers (e.g. 7B SFT 17120). "
     "File deleted 2024-12-11 (moved to docs.nvidia.com). Megatron-core (NeMo) with TP/PP as listed; DP = #GPUs/(TP*PP); GA = GBS/(MBS*DP). LoRA rank/targets, activation recompute, optimizer and distributed-optimizer settings not stated. "
     "Precision is FP8 (Transformer Engine) - not bf16. The 70B SFT row (16 GPUs) is omitted.")
T = [("LLAMA2-7B","SFT",8,32,1,1,1,16891,673),("LLAMA2-13B","SFT",8,32,1,1,4,10176,787),("LLAMA2-7B","LoRA",8,32,1,1,1,24824,663),
     ("LLAMA2-13B","LoRA",8,32,1,1,1,14629,757),("LLAMA2-70B","LoRA",8,32,1,2,4,2621,722)]
HF = {"LLAMA2-7B":"meta-llama/Llama-2-7b-hf","LLAMA2-13B":"meta-llama/Llama-2-13b-hf","LLAMA2-70B":"meta-llama/Llama-2-70b-hf"}
for m, task, n, gbs, mbs, tp, pp, tps, tfl in T:
    dp = n//(tp*pp); ga = gbs//(mbs*dp)
    R(source=SRC, quote=f"| {m} | {task} | {n} | {gbs} | {mbs} | 4096 | {tp} | {pp} | {tps} | {tfl} |", model=HF[m]+" (NeMo-converted)", gpu="NVIDIA H100 (DGX-H100, 80GB SXM)",
      n_gpus=n, method=("full" if task=="SFT" else "lora"), gc="unstated", sharding="unstated", offload="none", precision="fp8", batch_per_device=mbs,
      grad_accum=ga, seq_len=4096, packing="yes", lora_rank=("unstated" if task=="LoRA" else ""), lora_targets=("unstated" if task=="LoRA" else ""),
      attention="unstated", framework="NVIDIA NeMo 24.07 (Megatron-Core, Transformer Engine)", measured=tps, unit="tokens/s/gpu",
      what_counted=f"'Tokens / sec / GPU' (Model TFLOP/sec/GPU {tfl})",
      notes=f"TP {tp}, PP {pp}, so DP {dp}; grad_accum derived = GBS/(MBS*DP). sharding=unstated: Megatron TP/PP + data parallel (distributed optimizer not stated). " + N)
