from common import R, git_show
import csv
C = "24bdadb"
SRC = "foundation-model-stack/fms-acceleration:scripts/benchmarks/refs/a100_80gb.csv@24bdadb"
t = git_show("foundation-model-stack/fms-acceleration", C, "scripts/benchmarks/refs/a100_80gb.csv")
N = ("Reference benchmark CSV (last changed 2025-02-07). Versions (refs/requirements.txt): torch 2.4.1, transformers 4.48.1, peft 0.13.2, accelerate 1.0.1, trl 0.13.0, bitsandbytes 0.43.3. "
     "Settings from scripts/benchmarks/defaults.yaml + scenarios.yaml + benchmark.py @24bdadb (not columns of the CSV): dataset alpaca (yahma/alpaca-cleaned formatting), packing True and max_seq_len 4096 (benchmark.py defaults), "
     "max_steps 100, gradient_accumulation_steps 1 (per_device batch = effective batch / num_gpus; effective batch 4 or 8), gradient_checkpointing True, use_flash_attn True, include_tokens_per_second True. "
     "2-GPU runs: accelerate FSDP FULL_SHARD, TRANSFORMER_BASED_WRAP, BACKWARD_PRE, no offload, accelerate mixed_precision 'no'. "
     "train_tokens_per_second from HF Trainer counts the tokens of one rank's dataloader over the runtime, i.e. per GPU (check: Mistral-7B full 1 GPU: 534.95 s x 3062.7 tok/s ~= 100 steps x 4 x 4096). "
     "train_runtime includes the whole 100-step train() call (first steps/warm-up included).")
TG = {"q_proj k_proj v_proj o_proj":"q,k,v,o", "q_proj k_proj v_proj o_proj c_attn":"q,k,v,o (+c_attn for GPTBigCode)"}
for x in csv.DictReader(t.splitlines()):
    fc = x["framework_config"]
    if fc not in ("none","baseline-peft-bnb","accelerated-peft-bnb"): continue
    if not x["train_tokens_per_second"]: continue
    n = int(x["num_gpus"]); bs = int(x["per_device_train_batch_size"])
    if fc == "none":
        m = "lora" if x["peft_method"] == "lora" else "full"
        prec = "bf16"; pn = "torch_dtype bfloat16 with no AMP flag (bf16/fp16 columns empty) = pure bf16 weights"
        fw = "HF Trainer via fms-hf-tuning sft_trainer (no acceleration plugin)"
    else:
        m = "qlora"; prec = "mixed"; pn = "bf16 True (AMP) + torch_dtype bfloat16; bnb 4-bit quant_type nf4 (sample-configurations/baseline-peft-bnb-nf4-sample-configuration.yaml; double-quant not set there)"
        fw = ("HF Trainer + peft + bitsandbytes (baseline-peft-bnb: standard HF QLoRA path)" if fc=="baseline-peft-bnb" else
              "HF Trainer + fms-acceleration accelerated-peft bnb plugin (QLoRA loading fixes, no fused kernels)")
    q = f"{fc},{x['model_name_or_path']},num_gpus {n},{x['peft_method'] or 'full'},pdbs {bs},r {x['r']},train_runtime {x['train_runtime']},train_tokens_per_second {x['train_tokens_per_second']}"
    for unit, val, wc in [("tokens/s/gpu", x["train_tokens_per_second"], "HF Trainer train_tokens_per_second (per rank)"),]:
        R(source=SRC, quote=q, model=x["model_name_or_path"], gpu="NVIDIA A100-80GB", n_gpus=n, method=m, gc="yes", sharding=("fsdp" if n>1 else "none"),
          offload="none", precision=prec, batch_per_device=bs, grad_accum=1, seq_len=4096, packing="yes", lora_rank=(x["r"] if m!="full" else ""),
          lora_targets=(TG.get(x["target_modules"], x["target_modules"]) if m!="full" else ""), attention="flash", framework=fw, measured=val, unit=unit,
          what_counted=wc + f"; train_runtime {x['train_runtime']} s for 100 steps; train_samples_per_second {x['train_samples_per_second']}",
          notes=f"framework_config={fc}; {pn}; lora_alpha {x['lora_alpha'] or '-'}, dropout {x['lora_dropout'] or '-'}; epoch {x['epoch']}. " + N)
