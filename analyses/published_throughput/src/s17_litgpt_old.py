from common import R
SRC = "Lightning-AI/litgpt:config_hub/finetune/README.md@58c5b188"
N = ("Older version of the config-hub table (commit 58c5b188, 2024-04-19; these A100 rows were removed later). Columns: Size, Dataset (Alpaca 2k), Epochs, Val loss, Peak memory, Max seq length, Micro batch size, Precision (bfloat16), Training runtime (with machine in brackets). "
     "A100 memory variant not stated. Config values read at the commit named in each row. Multi-device runs use Lightning FSDPStrategy with activation_checkpointing_policy={Block} (litgpt finetune code); single device has no activation checkpointing. "
     "Runtime likely litgpt's printed 'Training time' (includes periodic/final validation) - not stated. Alpaca2k ~1900 train samples truncated at 512 tokens, padded per batch.")
rows = [("gemma-7b/lora.yaml","google/gemma-7b","lora",1,2,1,16,"query,key,value,projection,mlp,head (all true)",6,11.47,"1xA100","84a73fd0"),
        ("gemma-7b/qlora.yaml","google/gemma-7b","qlora",1,2,1,16,"query,key,value,projection,mlp,head (all true)",6,23.46,"1xA100","84a73fd0"),
        ("llama-2-7b/full.yaml","meta-llama/Llama-2-7b-hf","full",4,1,4,None,None,64,1.78,"4xA100","41dece20"),
        ("llama-3-8b/full.yaml","meta-llama/Meta-Llama-3-8B","full",4,1,4,None,None,64,2.14,"4xA100","58c5b188")]
for cfg, hf, m, n, ep, mb, r, tg, gbs, v, mach, cc in rows:
    R(source=SRC, quote=f"| {cfg} | ... | Alpaca 2k | {ep} | ... | 512 | {mb} | bfloat16 | {v} min ({mach}) |", model=hf, gpu="NVIDIA A100 (memory variant not stated)", n_gpus=n, method=m,
      gc=("yes" if n>1 else "no"), sharding=("fsdp" if n>1 else "none"), offload="none", precision="bf16", batch_per_device=mb, grad_accum=gbs//(mb*n), seq_len=512, packing="no",
      lora_rank=(r if m!="full" else ""), lora_targets=(tg if m!="full" else ""), attention="sdpa", framework="LitGPT (Lightning Fabric)", measured=v, unit="min total",
      what_counted=f"'Training runtime' for {ep} epoch(s) of Alpaca2k", notes=f"Config {cfg}@{cc}: devices {n}, global_batch_size {gbs} (grad_accum derived), epochs {ep}, no max_steps" + (", quantize bnb.nf4" if m=="qlora" else "") + ". " + N)
