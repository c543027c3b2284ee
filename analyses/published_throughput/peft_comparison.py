"""The `holdout-peft-comparison` published throughputs (tests/data/published/throughput_peft_comparison.csv): gathered after the step-time
model's last change (attention per tile, reports/step-time/calibration.md), from projects the main table does not
hold, and compared once (`analyses/step_time_vs_published.py --peft-comparison`). Sources and caveats:
tests/data/published/throughput_peft_comparison_SOURCES.md.
The PEFT rows are read from a fetched snapshot of huggingface/peft (`fetch github:huggingface/peft`); the others are
typed in from the quoted text.

Usage: python analyses/published_throughput/peft_comparison.py
"""
import csv
import json
import os

from common import git_show
COLS="split,source,quote,model,gpu,n_gpus,method,gc,sharding,offload,precision,batch_per_device,grad_accum,seq_len,packing,lora_rank,lora_targets,attention,framework,measured,unit,what_counted,notes".split(",")
rows=[]
def add(**k):
    r={c:k.get(c,"unstated") for c in COLS}; r["split"]="holdout-peft-comparison"; rows.append(r)

# ---------- PEFT MetaMathQA method_comparison (L40S) ----------
runs=[("51c2ff666b142d004c12609c9686cf17ca055751",f) for f in ["lora--llama-3.2-3B-rank32","lora--llama-3.2-3B-rank64","lora--llama-3.2-3B-rank64-rslora","lora--llama-3.2-3B-rank10-target-mlp","full-finetuning--llama-3.2-3B-lr_0.00001"]]
runs+=[("a99942694efe9abae7563ab3f973e54942fc98af",f) for f in ["lora--llama-3.2-3B-rank32","lora--llama-3.2-3B-rank64","lora--llama-3.2-3B-rank64-rslora","lora--llama-3.2-3B-rank10-target-mlp","full-finetuning--llama-3.2-3B-lr_0.00001"]]
runs+=[("f650b08abb011e4cf82b76faf33360d1a8a386f1",f) for f in ["lora--llama-3.2-3B-rank32","lora--llama-3.2-3B-rank64","lora--llama-3.2-3B-rank64-rslora","full-finetuning--llama-3.2-3B-lr_0.00001"]]
runs+=[("f4763a0e75bab8e9c85b588f82e1d8676ae3fda9","lora--llama-3.2-3B-rank10-target-mlp")]
for c,f in runs:
    p=f"method_comparison/MetaMathQA/results/{f}.json"
    d=json.loads(git_show("huggingface/peft", c, p))
    ri=d["run_info"]; t=ri["train_config"]; pc=ri["peft_config"] or {}; m=d["train_info"]["metrics"]
    win=[x for x in m if "tokens / sec" in x]; last=win[-1]
    tps=[x["tokens / sec"] for x in win]
    pk=d["meta_info"]["package_info"]; acc=d["meta_info"]["system_info"]["accelerator"]
    assert acc=="NVIDIA L40S" and t["batch_size"]==4 and t["max_seq_length"]==768 and not t.get("use_gc") and not t["compile"] and not t["use_amp"] and t["dtype"]=="bfloat16"
    full = pc=={} or pc.get("peft_type") is None
    tm=pc.get("target_modules") or []
    short={"q_proj":"q","k_proj":"k","v_proj":"v","o_proj":"o","gate_proj":"gate","up_proj":"up","down_proj":"down"}
    order=["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]
    targets=",".join(short[x] for x in order if x in tm)
    gcnote = "use_gc=False in train_config" if "use_gc" in t else "no use_gc option existed at this commit (GC only via prepare_model_for_kbit_training for int8/int4 dtypes, not used here)"
    add(source=f"huggingface/peft:{p}@{c}",
        quote=f"train_info.metrics[step={last['step']}]: 'tokens / sec': {last['tokens / sec']}",
        model="meta-llama/Llama-3.2-3B", gpu="NVIDIA L40S", n_gpus=1,
        method="full" if full else "lora", gc="no", sharding="none", offload="none",
        precision="bf16",
        batch_per_device=4, grad_accum=1, seq_len=768, packing="no",
        lora_rank="n/a" if full else pc["r"], lora_targets="n/a" if full else targets,
        attention="unstated",
        framework="custom PyTorch loop (PEFT method_comparison/MetaMathQA run.py; no HF Trainer; torch.compile off; AdamW)",
        measured=last["tokens / sec"], unit="tokens/s",
        what_counted="single GPU. Non-padding tokens (+1 EOS per sample) summed over the last 250 train steps divided by the summed per-step wall time of those steps (eval time excluded). One step = one micro-batch of 4 = one optimizer step.",
        notes=(f"run created_at {ri['created_at']}; torch {pk['torch-version']}, transformers {pk['transformers-version']}, peft {pk['peft-version']}. "
               f"Config: dtype=bfloat16, use_amp=False (model weights bf16; {'all params trained in bf16 with AdamW' if full else 'autocast_adapter_dtype=True so LoRA adapter weights fp32 while base bf16'}), {gcnote}, attn_implementation=None (transformers default, not stated). "
               f"max_seq_length=768 is a cap; MetaMathQA samples vary in length, padded per batch, batches drawn via length-bucketing (bucket 80 samples). 5000 steps, 4,198,051 train tokens in total. "
               f"20 windows of 250 steps; window tokens/s ranged {min(tps):.1f}-{max(tps):.1f}; value given is the final window."
               + ("" if full else f" LoRA alpha {pc.get('lora_alpha')}, dropout {pc.get('lora_dropout')}, use_rslora={pc.get('use_rslora')}."))
        )

# ---------- HF blog: DeepSpeed to FSDP and back ----------
blog="huggingface/blog:deepspeed-to-fsdp-and-back.md@09e9aa2d9b04feabe06bf98d25691caf8d967eea"
common=dict(source=blog, model="ibm-granite/granite-7b-base", gpu="NVIDIA A100 (variant not stated)", n_gpus=4, method="full", gc="unstated", offload="unstated",
            precision="mixed", batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated", lora_rank="n/a", lora_targets="n/a", attention="unstated")
bn="Blog (Jun 2024, HF Accelerate >=0.30 'aligned mode'): 'We used four A100 GPUs ... Batch size of 8; Model loaded in torch.bfloat16; Mixed precision is the same dtype.' Whether batch 8 is per device or global, sequence length, GC and dataset are not stated. Table 2 of the blog: FSDP aligned mode and DeepSpeed both keep fp32 params in the optimizer with bf16 training. MFU reported 0.41 (FSDP) / 0.40 (DS). Blog calls it 'Ballpark throughput comparisons'. Reproduction code referenced: huggingface/accelerate issue 2624."
add(**common, quote="| FSDP (aligned mode) | 3158.7 | 10.4 | 0.41 |", sharding="fsdp", framework="accelerate (FSDP full sharding, aligned mixed-precision mode)", measured=3158.7, unit="tokens/s/gpu", what_counted="'Tokens / sec / device' column of Table 3", notes=bn)
add(**common, quote="| FSDP (aligned mode) | 3158.7 | 10.4 | 0.41 |", sharding="fsdp", framework="accelerate (FSDP full sharding, aligned mixed-precision mode)", measured=10.4, unit="s/step", what_counted="'Step time (s)' column of Table 3; what one step holds (micro-batch vs optimizer step, grad accumulation) not stated; same run as the tokens/s/gpu row", notes=bn)
add(**common, quote="| DeepSpeed | 3094.5 | 10.6 | 0.40 |", sharding="zero3", framework="accelerate + DeepSpeed ZeRO-3", measured=3094.5, unit="tokens/s/gpu", what_counted="'Tokens / sec / device' column of Table 3", notes=bn)
add(**common, quote="| DeepSpeed | 3094.5 | 10.6 | 0.40 |", sharding="zero3", framework="accelerate + DeepSpeed ZeRO-3", measured=10.6, unit="s/step", what_counted="'Step time (s)' column of Table 3; what one step holds not stated; same run as the tokens/s/gpu row", notes=bn)

# ---------- axolotl Llama 4 Scout QLoRA ----------
ax="axolotl-ai-cloud/axolotl:examples/llama-4/README.md@682a9cf79bc6a5fc4a699f2b63b00c7b2e59376d"
axm="axolotl-quants/Llama-4-Scout-17B-16E-Linearized-bnb-nf4-bf16 (Llama 4 Scout 17B-active/16-expert MoE, 109B total, experts linearized, NF4 4-bit base)"
add(source=ax, quote="Our Single H100 implementation for Llama 4 Scout uses only 64.5GB VRAM for post-training with 4k context length @ 519 tokens/second.",
    model=axm, gpu="NVIDIA H100 (variant not stated)", n_gpus=1, method="qlora", gc="yes", sharding="none", offload="none", precision="bf16",
    batch_per_device=1, grad_accum=1, seq_len=4096, packing="yes", lora_rank=32,
    lora_targets="q,k,v,o (self_attn) + shared_expert gate,up,down; routed experts frozen",
    attention="flex (flex_attention; not one of sdpa/flash/eager)",
    framework="axolotl (torch.compile on; flex_attn compiled max-autotune-no-cudagraphs; Liger RMSNorm/LayerNorm/GLU; Cut Cross Entropy; axolotl LoRA MLP/QKV/O Triton kernels; optimizer adamw_torch_4bit)",
    measured=519, unit="tokens/s",
    what_counted="single GPU, so per GPU; README figure from linked W&B run (wandb.ai/axolotl-ai/llama4-flexattn-qlora/runs/wpie7dkj); whether padding is counted and averaging window not stated",
    notes="Config examples/llama-4/scout-qlora-single-h100-flex.yaml at the same commit: gradient_checkpointing: offload (activation checkpoints offloaded to CPU), sample_packing true + pad_to_sequence_len true, bf16 true, tf32 true, load_in_4bit, micro_batch_size 1, GA 1, lora_alpha 64. Commit message: 'use transformers 4.51.2'. 64.5 GB VRAM.")
add(source=ax, quote="Multi-GPU (4xH100) for Llama 4 Scout uses 62.8GB VRAM/GPU @ 4k contenxt length @ 280tps/gpu",
    model=axm, gpu="NVIDIA H100 (variant not stated)", n_gpus=4, method="qlora", gc="yes", sharding="fsdp", offload="none", precision="bf16",
    batch_per_device=2, grad_accum=1, seq_len=4096, packing="yes", lora_rank=32,
    lora_targets="q,k,v,o (self_attn) + shared_expert gate,up,down; routed experts frozen",
    attention="flex (flex_attention; not one of sdpa/flash/eager)",
    framework="axolotl (FSDP2 full_shard, no torch.compile; Liger RMSNorm/LayerNorm/GLU; optimizer adamw_torch_4bit)",
    measured=280, unit="tokens/s/gpu",
    what_counted="per GPU ('280tps/gpu'); from linked W&B run (runs/2lkezdj8); whether padding counted not stated",
    notes="Config examples/llama-4/scout-qlora-flexattn-fsdp2.yaml at the same commit: fsdp_version 2, FULL_SHARD, reshard_after_forward, fsdp_activation_checkpointing true, fsdp_offload_params false, micro_batch_size 2, GA 1, sample_packing + pad_to_sequence_len, bf16+tf32, flex_attention. transformers 4.51.2 per commit message.")

# ---------- Soup H100 validation (STEP 17) ----------
sp="MakazhanAlpamys/Soup:benchmarks/gate-h100-validation.md@242845337cb216a021ba33e9dd3c3bca3cbab692"
sc=dict(source=sp, model="meta-llama/Llama-3.1-8B (base vs -Instruct not stated for this step; other steps of the same record use Llama-3.1-8B-Instruct)",
        gpu="NVIDIA H100 80GB HBM3 (nvidia-smi name, i.e. SXM part; box has PCIe-switch PIX topology, no NVLink)", n_gpus=1, method="lora", gc="no",
        sharding="none", offload="none", precision="bf16", batch_per_device=4, grad_accum="unstated", seq_len=1024, packing="unstated", lora_rank=16, lora_targets="unstated",
        unit="tokens/s",
        what_counted="single GPU; median of 5 interleaved repeats of 80-step runs. The record defines tok/s as num_tokens / train_runtime, both reported by the HF trainer (so includes step-0 warmup; whether num_tokens counts padding not stated)")
sn="Record says: 'Llama-3.1-8B + LoRA r=16, bf16, batch 4, seq 1024, 80 steps, 5 repeats interleaved'; limitations section: 'no gradient checkpointing'. Box software: torch 2.13.0+cu130, transformers 4.57.6, trl 0.26.2, peft 0.20.0, accelerate 1.14.0. 'bf16' as stated (LoRA adapters' dtype not stated). seq 1024 was a silent max_length cap bug at the time; whether samples fill 1024 tokens not stated. "
add(**sc, quote="| baseline (SDPA) | 9621.1 | 0.83% | 70.99 GiB | 1965 MHz | 1.000x |", attention="sdpa", framework="Soup CLI (soup train) -> TRL SFTTrainer", measured=9621.1, notes=sn+"Peak VRAM 70.99 GiB; SM clock 1965 MHz busy; SDPA dispatched to cuDNN Hopper flash kernel.")
add(**sc, quote="| FlashAttention 2 | 9764.8 | 0.92% | 70.99 GiB | 1965 MHz | **1.015x** |", attention="flash", framework="Soup CLI (soup train) -> TRL SFTTrainer (flash_attention_2)", measured=9764.8, notes=sn+"Peak VRAM 70.99 GiB; SM clock 1965 MHz.")
add(**sc, quote="| Liger (HF flag) | 10115.3 | 0.22% | 61.81 GiB | 1905 MHz | **1.051x**, VRAM -12.9% |", attention="sdpa", framework="Soup CLI (soup train) -> TRL SFTTrainer with Liger kernels (HF use_liger_kernel flag; LigerRMSNorm/LigerSwiGLUMLP verified, fused linear CE path)", measured=10115.3, notes=sn+"Peak VRAM 61.81 GiB; SM clock 1905 MHz.")
add(**sc, quote="| FA2 + Liger | 10256.0 | 0.53% | 61.81 GiB | 1920 MHz | **1.066x**, VRAM -12.9% |", attention="flash", framework="Soup CLI (soup train) -> TRL SFTTrainer, flash_attention_2 + Liger kernels (HF flag)", measured=10256.0, notes=sn+"Peak VRAM 61.81 GiB; SM clock 1920 MHz.")

# ---------- Exxact LoRA benchmark on RTX PRO Blackwell ----------
ex="https://www.exxactcorp.com/blog/benchmark/lora-fine-tuning-benchmark-on-nvidia-gpus"
ec=dict(source=ex, model="meta-llama/Llama-3.1-8B-Instruct", method="lora", gc="unstated", offload="unstated", precision="unstated",
        batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated", lora_rank="unstated", lora_targets="unstated", attention="unstated",
        framework="HF Transformers + DDP (torchrun)")
en="Blog dated June 4, 2026. Setup text: 'LoRA fine-tuning with Llama 3.1 8B instruct using HuggingFace Transformers with DDP (torchrun). Throughput is reported as per-step tokens-per-second averaged across steps 1-60 (excluding ...' (the stored copy is cut there; the detailed setup and scaling tables were not readable). VRAM ~24.8-25.0 GB per GPU. GPUs are not in the preferred list; batch/seq/GC unknown, so use only as a weak check."
add(**ec, quote="Per-GPU throughput drops only 3.5% from 1 to 4 GPUs (2,777 → 2,679 tok/s per GPU)", gpu="NVIDIA RTX PRO 4500 Blackwell (Workstation Edition)", n_gpus=1, sharding="none", measured=2777, unit="tokens/s", what_counted="single GPU (per GPU); per-step tokens/s averaged over steps 1-60 with some exclusion", notes=en)
add(**ec, quote="Per-GPU throughput drops only 3.5% from 1 to 4 GPUs (2,777 → 2,679 tok/s per GPU)", gpu="NVIDIA RTX PRO 4500 Blackwell (Workstation Edition)", n_gpus=4, sharding="ddp", measured=2679, unit="tokens/s/gpu", what_counted="per GPU, 4-GPU DDP run", notes=en+" Same run as the 10,717 tok/s aggregate row.")
add(**ec, quote="4× RTX PRO 4500 delivers 10,717 tok/s aggregate training throughput on Llama-3.1-8B LoRA, a 3.86× speedup vs a single GPU.", gpu="NVIDIA RTX PRO 4500 Blackwell (Workstation Edition)", n_gpus=4, sharding="ddp", measured=10717, unit="tokens/s", what_counted="aggregate over 4 GPUs (NOT per GPU); same run as the 2,679 tokens/s/gpu row, so not an independent measurement", notes=en)
add(**ec, quote="RTX PRO 6000 Server Edition is the fastest single card in this test at 4,962 tok/s.", gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition", n_gpus=1, sharding="none", measured=4962, unit="tokens/s", what_counted="single GPU (per GPU)", notes=en)
add(**ec, quote="A 2-GPU configuration reaches 9,541 tok/s, approaching 4× RTX PRO 4500 aggregate throughput.", gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition", n_gpus=2, sharding="ddp", measured=9541, unit="tokens/s", what_counted="aggregate over 2 GPUs (NOT per GPU)", notes=en)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "published", "throughput_peft_comparison.csv"), "w", newline="") as fh:
    w=csv.DictWriter(fh,fieldnames=COLS); w.writeheader(); w.writerows(rows)
print(len(rows))
