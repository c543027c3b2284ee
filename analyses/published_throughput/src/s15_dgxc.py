from common import R
N = ("NVIDIA DGX Cloud benchmarking recipe, release v25.02 (commit 8f5cbb3, tree dated 2025-06-09): 'Performance for Llama 3 fine-tuning is measured by seconds per iteration ... we are using average time from the last 20 training steps'; "
     "throughput row in the doc = seq_len x GBS / step time (derived, aggregate over all GPUs; consistent with seq_len 4096). NeMo 2.0 recipe (llama3_finetune.py) on container nvcr.io/nvidia/nemo:24.12 (setup.sh FW_VERSION), SQuAD data (SquadDataModule, packed-sequence metadata), "
     "Megatron-Core TP/PP as in the table header; sequence_parallel when TP>1; FP8 = bf16_with_fp8_mixed plugin. Micro-batch size, LoRA rank/targets and activation recompute are not stated in the README. "
     "The 8B table header says 'PP=41' (typo; a 1-GPU-per-replica data-parallel layout TP=1 PP=1 is implied by DP=8 in a later version's config table).")
def row(src, quote, model, meth, prec, v, tp, pp, vp, extra=""):
    R(source=src, quote=quote, model=model, gpu="NVIDIA H100 80GB", n_gpus=8, method=meth, gc="unstated", sharding="unstated", offload="none", precision=prec,
      batch_per_device="unstated", grad_accum="unstated", seq_len=4096, packing="yes", lora_rank=("unstated" if meth=="lora" else ""), lora_targets=("unstated" if meth=="lora" else ""),
      attention="unstated", framework="NVIDIA NeMo 2.0 (24.12 container, Megatron-Core)", measured=v, unit="s/step",
      what_counted="Training step time (seconds per step), average of last 20 steps, global batch 32 x 4096 tokens",
      notes=f"TP={tp}, PP={pp}, VP={vp}; GBS 32 on 8 GPUs. {extra} " + N)
S8 = "NVIDIA/dgxc-benchmarking:llama3/finetuning/README_8b.md@8f5cbb3"
S70 = "NVIDIA/dgxc-benchmarking:llama3/finetuning/README_70b.md@8f5cbb3"
row(S8, "Llama3 8b Finetuning SFT BF16 | Training step time (seconds per step) | 1.32 (8x H100, GBS=32) | Throughput 99296 tok/s", "meta-llama/Meta-Llama-3-8B", "full", "bf16", 1.32, 1, "1 (header says 41)", "None", "MFU 56.38% per doc.")
row(S8, "Llama3 8b Finetuning SFT FP8 | step time 0.95 (8x H100, GBS=32) | 137970 tok/s", "meta-llama/Meta-Llama-3-8B", "full", "fp8", 0.95, 1, "1 (header says 41)", "None")
row(S8, "Llama3 8b Finetuning LORA BF16 | step time 0.92 (8x H100, GBS=32) | 142469 tok/s", "meta-llama/Meta-Llama-3-8B", "lora", "bf16", 0.92, 1, "1 (header says 41)", "None")
row(S8, "Llama3 8b Finetuning LORA FP8 | step time 0.68 (8x H100, GBS=32) | 192752 tok/s", "meta-llama/Meta-Llama-3-8B", "lora", "fp8", 0.68, 1, "1 (header says 41)", "None")
row(S70, "Llama3 70b Finetuning LORA BF16 (TP=2, PP=4, CP=1, VP=20) | step time 9.118 (8x H100, GBS=32) | 14375 tok/s", "meta-llama/Meta-Llama-3-70B", "lora", "bf16", 9.118, 2, 4, 20)
row(S70, "Llama3 70b Finetuning LORA FP8 (TP=2, PP=4, CP=1, VP=20) | step time 6.5 (8x H100, GBS=32) | 20164 tok/s", "meta-llama/Meta-Llama-3-70B", "lora", "fp8", 6.5, 2, 4, 20)
