from common import R, git_show
import csv
C = "fc78b55"
SRC = "foundation-model-stack/fms-acceleration:scripts/benchmarks/refs/a100_80gb_granite.csv@fc78b55"
t = git_show("foundation-model-stack/fms-acceleration", C, "scripts/benchmarks/refs/a100_80gb_granite.csv")
N = ("Reference CSV for ibm/PowerLM-3b (last changed 2024-10-18). Versions (refs/requirements_granite.txt): torch 2.4.1, transformers 4.45.2, peft 0.12.0, accelerate 0.34.2, bitsandbytes 0.43.3. "
     "scenarios-granite.yaml @fc78b55: full-finetuning and standard-peft use bf16: True (AMP) + torch_dtype bfloat16; LoRA r16 alpha16 dropout 0.1 on q,k,v,o. Other settings as in the main a100_80gb.csv benchmark "
     "(defaults.yaml + benchmark.py @fc78b55: packing True, max_seq_len 4096, max_steps 100, GA 1, gradient_checkpointing True, use_flash_attn True; 2 GPUs via accelerate FSDP FULL_SHARD). "
     "train_tokens_per_second is HF Trainer's per-rank figure (per GPU).")
for x in csv.DictReader(t.splitlines()):
    fc = x["framework_config"]
    if fc not in ("none","baseline-peft-bnb") or not x["train_tokens_per_second"]: continue
    n = int(x["num_gpus"]); bs = int(x["per_device_train_batch_size"])
    m = "qlora" if fc == "baseline-peft-bnb" else ("lora" if x["peft_method"]=="lora" else "full")
    R(source=SRC, quote=f"{fc},ibm/PowerLM-3b,num_gpus {n},{x['peft_method'] or 'full'},pdbs {bs},train_runtime {x['train_runtime']},train_tokens_per_second {x['train_tokens_per_second']}",
      model="ibm/PowerLM-3b", gpu="NVIDIA A100-80GB", n_gpus=n, method=m, gc="yes", sharding=("fsdp" if n>1 else "none"), offload="none", precision=("mixed" if x["bf16"].upper()=="TRUE" else "bf16"),
      batch_per_device=bs, grad_accum=1, seq_len=4096, packing="yes", lora_rank=(x["r"] if m!="full" else ""), lora_targets=("q,k,v,o" if m!="full" else ""), attention="flash",
      framework=("HF Trainer + peft + bitsandbytes nf4 (baseline-peft-bnb)" if m=="qlora" else "HF Trainer via fms-hf-tuning (no acceleration plugin)"), measured=x["train_tokens_per_second"],
      unit="tokens/s/gpu", what_counted=f"HF Trainer train_tokens_per_second (per rank); train_runtime {x['train_runtime']} s; train_samples_per_second {x['train_samples_per_second']}",
      notes=f"framework_config={fc}; bf16 column {x['bf16'] or 'empty'}" + ("" if x["bf16"] else " (empty bf16 column = no AMP flag recorded, i.e. pure bf16 torch_dtype; scenarios-granite.yaml at fc78b55 lists bf16: True for these scenarios - discrepancy, precision column follows the CSV)") + f"; epoch {x['epoch']}. " + N)
