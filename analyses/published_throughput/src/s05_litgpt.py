from common import R, git_show
SRC = "Lightning-AI/litgpt:config_hub/finetune/README.md@26857050fe3ff627cd714fe92f5838f51a3d5efa"
CFGC = "00af8b0d"
rows = """falcon-7b/lora.yaml|falcon-7b|4|512|1|1xA10G|24.84
falcon-7b/lora.yaml|falcon-7b|4|512|1|4xA10G|24.94
falcon-7b/qlora.yaml|falcon-7b|4|512|1|1xA10G|50.85
gemma-2b/full.yaml|gemma-2b|1|512|1|4xA10G|14.06
gemma-2b/lora.yaml|gemma-2b|2|512|2|1xA10G|9.41
gemma-2b/lora.yaml|gemma-2b|2|512|2|4xA10G|9.41
gemma-2b/qlora.yaml|gemma-2b|2|512|2|1xA10G|12.91
gemma-7b/qlora.yaml|gemma-7b|2|512|1|1xA10G|43.58
gemma2-2b/lora.yaml|gemma-2b|2|512|2|1xA10G|11.96
gemma2b/qlora.yaml|gemma-2b|2|512|2|1xA10G|16.06
gemma2-9b/qlora.yaml|gemma-2-9b|2|512|1|1xA10G|50.01
llama-2-7b/lora.yaml|llama-2-7b|4|512|2|1xA10G|32.82
llama-2-7b/lora.yaml|llama-2-7b|4|512|2|4xA10G|32.83
llama-2-7b/qlora.yaml|llama-2-7b|4|512|2|1xA10G|45.67
llama-3-8b/lora.yaml|llama-3-8b|2|512|1|1xA10G|14.79
llama-3-8b/lora.yaml|llama-3-8b|2|512|1|4xA10G|14.88
llama-3-8b/qlora.yaml|llama-3-8b|2|512|2|1xA10G|22.24
llama-3.1-8b/lora.yaml|llama-3.1-8b|2|512|1|1xA10G|13.36
llama-3.1-8b/qlora.yaml|llama-3.1-8b|2|512|2|1xA10G|21.81
llama-3.2-1b/full.yaml|llama-3.2-1b|1|512|4|1xA10G|2.01
llama-3.2-1b/lora.yaml|llama-3.2-1b|2|512|1|1xA10G|4.17
llama-3.2-1b/qlora.yaml|llama-3.2-1b|2|512|2|1xA10G|6.20
llama-3.2-3b/full.yaml|llama-3.2-3b|1|512|4|1xA10G|4.71
llama-3.2-3b/lora.yaml|llama-3.2-3b|2|512|1|1xA10G|8.31
llama-3.2-3b/qlora.yaml|llama-3.2-3b|2|512|2|1xA10G|14.89
mistral-7b-v0.2/lora.yaml|mistral-7b-v0.2|4|512|2|1xA10G|31.00
mistral-7b-v0.2/lora.yaml|mistral-7b-v0.2|4|512|2|4xA10G|31.00
mistral-7b-v0.2/qlora.yaml|mistral-7b-v0.2|4|512|2|1xA10G|44.75
mistral-7b/lora.yaml|mistral-7b|4|512|2|1xA10G|31.01
mistral-7b/lora.yaml|mistral-7b|4|512|2|4xA10G|31.03
mistral-7b/qlora.yaml|mistral-7b|4|512|2|1xA10G|44.75
phi-2/full.yaml|phi-2|1|512|4|4xA10G|11.87
phi-2/lora.yaml|phi-2|1|512|4|1xA10G|3.78
phi-2/lora.yaml|phi-2|1|512|4|4xA10G|3.78
phi-2/qlora.yaml|phi-2|1|512|4|1xA10G|4.51
phi-3/full.yaml|Phi-3-mini-4k-instruct|1|512|4|1xA10G|6.93
phi-3/lora.yaml|Phi-3-mini-4k-instruct|1|512|4|1xA10G|6.46
phi-3/qlora.yaml|Phi-3-mini-4k-instruct|1|512|4|1xA10G|7.47
stablelm-base-alpha-3b/full.yaml|stablelm-base-alpha-3b|1|512|1|4xA10G|70.13
stablelm-base-alpha-3b/lora.yaml|stablelm-base-alpha-3b|4|512|1|1xA10G|13.07
stablelm-base-alpha-3b/lora.yaml|stablelm-base-alpha-3b|4|512|1|4xA10G|13.16
stablelm-base-alpha-3b/qlora.yaml|stablelm-base-alpha-3b|4|512|1|1xA10G|25.86
tiny-llama/full.yaml|tiny-llama|1|512|4|1xA10G|2.58
tiny-llama/full.yaml|tiny-llama|1|512|4|4xA10G|2.57
tiny-llama/lora.yaml|tiny-llama|3|512|8|1xA10G|8.09
tiny-llama/qlora.yaml|tiny-llama|3|512|8|1xA10G|8.70"""
HF = {"falcon-7b":"tiiuae/falcon-7b","gemma-2b":"google/gemma-2b","gemma-7b":"google/gemma-7b","gemma-2-9b":"google/gemma-2-9b",
      "llama-2-7b":"meta-llama/Llama-2-7b-hf","llama-3-8b":"meta-llama/Meta-Llama-3-8B","llama-3.1-8b":"meta-llama/Meta-Llama-3.1-8B",
      "llama-3.2-1b":"meta-llama/Llama-3.2-1B","llama-3.2-3b":"meta-llama/Llama-3.2-3B","mistral-7b-v0.2":"mistralai/Mistral-7B-v0.2 (per config checkpoint_dir)",
      "mistral-7b":"mistralai/Mistral-7B-v0.1","phi-2":"microsoft/phi-2","Phi-3-mini-4k-instruct":"microsoft/Phi-3-mini-4k-instruct",
      "stablelm-base-alpha-3b":"stabilityai/stablelm-base-alpha-3b","tiny-llama":"TinyLlama/TinyLlama-1.1B (intermediate-step checkpoint per config)"}
def cfg(path):
    p = {"gemma2-2b/lora.yaml":"gemma2-2b/lora.yaml","gemma2b/qlora.yaml":"gemma2-2b/qlora.yaml","llama-3.2-1b/full.yaml":"llama-3.2-1B/full.yaml",
         "llama-3.2-1b/lora.yaml":"llama-3.2-1B/lora.yaml","llama-3.2-1b/qlora.yaml":"llama-3.2-1B/qlora.yaml","llama-3.2-3b/full.yaml":"llama-3.2-3B/full.yaml",
         "llama-3.2-3b/lora.yaml":"llama-3.2-3B/lora.yaml","llama-3.2-3b/qlora.yaml":"llama-3.2-3B/qlora.yaml"}.get(path, path)
    t = git_show("Lightning-AI/litgpt", CFGC, f"config_hub/finetune/{p}")
    d = {}
    for line in t.splitlines():
        s = line.strip()
        if s.startswith("#") or ":" not in s: continue
        k, v = s.split(":",1); d.setdefault(k.strip(), v.strip())
    return p, d
NOTE = ("README: 'All experiments were conducted using bfloat-16 precision on the Alpaca2k dataset'; 'Training runtime' column; benchmarks run on Lightning AI Studios; README also says 'All runs are single-GPU experiments, use --devices 4 to utilize more than one GPU' "
        "while the Machine column says 1xA10G or 4xA10G. Alpaca2k = mhenrichsen/alpaca_2k_test, 5% validation split (~1900 train samples), truncated at max_seq_length 512, padded per batch (no packing). "
        "litgpt prints 'Training time' around fit(), which includes periodic validation (eval.interval 100 steps) and a final validation - whether the table used that number is not stated. "
        "Config values (devices, global batch, LoRA flags, quantize) read from config_hub/finetune/<cfg> at commit 00af8b0d (README's last change); rows were added between 2024-04 and 2024-09 and the config may have differed at run time. "
        "Single-device runs: no activation checkpointing in litgpt finetune scripts; devices>1 uses Lightning FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}) (litgpt/finetune/*.py@00af8b0d). "
        "Attention: litgpt model uses torch scaled_dot_product_attention (code, not stated in README).")
for line in rows.splitlines():
    c, model, ep, msl, mb, mach, v = line.split("|")
    p, d = cfg(c)
    method = c.split("/")[1].split(".")[0]
    dev = int(d.get("devices","1") or 1)
    gbs = int(d.get("global_batch_size"))
    ga = gbs // (int(mb) * dev)
    tg = []
    for k in ("query","key","value","projection","mlp","head"):
        if d.get("lora_"+k) == "true": tg.append(k)
    extra = f"Config {p}: devices {dev}, global_batch_size {gbs} (grad_accum column derived = global/(micro*devices)), epochs {d.get('epochs')}, max_steps {d.get('max_steps') or 'none'}"
    if method != "full": extra += f", lora_r {d.get('lora_r')}, lora_alpha {d.get('lora_alpha')}, quantize {d.get('quantize') or 'none'}"
    if d.get("max_steps"): extra += f". NOTE max_steps {d.get('max_steps')} caps the run, so the runtime covers at most that many optimizer steps, not the full epoch"
    if mach == "4xA10G" and dev == 1: extra += ". Machine column says 4xA10G but the config runs on devices=1 and the time equals the 1xA10G row: effectively 1 GPU (n_gpus from config)"
    if mach == "4xA10G" and dev not in (1, 4): extra += f". Machine column 4xA10G but config devices={dev}: n_gpus taken from config, may be wrong"
    if mach == "1xA10G" and dev > 1: extra += ". Machine 1xA10G but config devices>1 - inconsistent"
    if c == "gemma2b/qlora.yaml": extra += ". README config name 'gemma2b/qlora.yaml' (typo for gemma2-2b/qlora.yaml) and model column says gemma-2b though section is Gemma 2 2B"
    if c.startswith("gemma2-2b"): extra += ". README model column says 'gemma-2b' but config is gemma2-2b (Gemma 2 2B: google/gemma-2-2b)"
    n = dev
    R(source=SRC, quote=f"| {c} | {model} | {ep} | {msl} | {mb} | {mach} | {v} min |", model=("google/gemma-2-2b" if c.startswith("gemma2") else HF[model]),
      gpu="NVIDIA A10G (24GB)", n_gpus=n, method=method, gc=("yes" if n>1 else "no"), sharding=("fsdp" if n>1 else "none"), offload="none", precision="bf16",
      batch_per_device=mb, grad_accum=ga, seq_len=msl, packing="no", lora_rank=(d.get("lora_r") if method!="full" else ""),
      lora_targets=(",".join(tg) if method!="full" else ""), attention="sdpa", framework="LitGPT (Lightning Fabric)", measured=v, unit="min total",
      what_counted=f"'Training runtime' for the whole config run ({ep} epoch(s) of Alpaca2k, or max_steps if set)", notes=extra + ". " + NOTE)

SRC2 = "Lightning-AI/litgpt:tutorials/resource-tables.md@26857050fe3ff627cd714fe92f5838f51a3d5efa"
N2 = ("Doc: last updated 10/20/2023, LitGPT commit 8641822, NVIDIA A100-SXM4-40GB, driver 525.125.06, PyTorch 2.1.0+cu121, bitsandbytes 0.41.1; 'All experiments were run using ... --precision bf16-true'; "
      "Alpaca dataset with its default length (longest training example: phi1.5 1044, StableLM 1034, Llama 2 1304 tokens); 'minibatch size of 128' (= global batch; GA = 128/micro). "
      "In finetune/lora.py@8641822 an 'iteration' is one micro-batch (iter_num loop; optimizer step every 128/micro iterations); micro-batches are random samples padded to the longest in the batch (no packing); LoRA r=8, alpha 16, query+value only (script defaults); "
      "eval_interval/eval time may be inside the timed 1k iterations - not stated. Multi-GPU uses Lightning FSDPStrategy with activation_checkpointing_policy={Block}; 1 GPU has no activation checkpointing.")
MOD = {"phi-1.5":"microsoft/phi-1_5","StableLM Alpha":"stabilityai/stablelm-base-alpha-3b","Llama 2 7":"meta-llama/Llama-2-7b-hf","Llama 2 13":"meta-llama/Llama-2-13b-hf"}
rt = [("1.3 B","phi-1.5","None",1,1,1.62),("1.3 B","phi-1.5","bnb.nf4",1,1,1.77),("1.3 B","phi-1.5","bnb.nf4-dq",1,1,1.87),("1.3 B","phi-1.5","None",2,1,1.65),("1.3 B","phi-1.5","None",4,1,1.70),
      ("3 B","StableLM Alpha","None",1,1,1.24),("3 B","StableLM Alpha","bnb.nf4",1,1,1.82),("3 B","StableLM Alpha","bnb.nf4-dq",1,1,1.87),("3 B","StableLM Alpha","None",2,1,1.33),("3 B","StableLM Alpha","None",4,1,1.50),
      ("7 B","Llama 2","None",1,1,2.36),("7 B","Llama 2","bnb.nf4",1,1,3.68),("7 B","Llama 2","bnb.nf4-dq",1,1,3.83),("7 B","Llama 2","None",2,1,2.52),
      ("13 B","Llama 2","None",1,1,3.19),("13 B","Llama 2","bnb.nf4",1,1,6.38),("13 B","Llama 2","bnb.nf4-dq",1,1,6.55),
      ("1.3 B","phi-1.5","None",1,2,3.81),("1.3 B","phi-1.5","None",2,2,3.63),("1.3 B","phi-1.5","None",4,2,3.64),
      ("3 B","StableLM Alpha","None",1,2,2.92),("3 B","StableLM Alpha","None",2,2,3.06),("3 B","StableLM Alpha","None",4,2,3.86),
      ("7 B","Llama 2","None",1,2,5.93),("7 B","Llama 2","None",2,2,6.48),("7 B","Llama 2","None",4,2,8.66),("13 B","Llama 2","None",1,4,10.25)]
for size, m, q, mb, n, v in rt:
    key = m if m != "Llama 2" else "Llama 2 " + size.split()[0]
    method = "lora" if q == "None" else "qlora"
    R(source=SRC2, quote=f"| {size} | {m} | {q} | {mb} | ... |{' '+str(n)+' x A100 |' if n>1 else ''} ... | {v} min |", model=MOD[key], gpu="NVIDIA A100-SXM4-40GB", n_gpus=n,
      method=method, gc=("yes" if n>1 else "no"), sharding=("fsdp" if n>1 else "none"), offload="none", precision="bf16", batch_per_device=mb, grad_accum=128//mb,
      seq_len="variable (Alpaca, no truncation; max 1034-1304)", packing="no", lora_rank=8, lora_targets="query,value", attention="sdpa", framework="lit-gpt @8641822 (Lightning Fabric)",
      measured=v, unit="min per 1000 iterations", what_counted="'Time 1k iterations' (1000 micro-batch iterations per device)",
      notes=("quantize "+q+(" (NF4 with double quantization)" if q.endswith("dq") else " (NF4)" if q!="None" else "")+". "+("Section 'Finetuning with LoRA on Multiple GPUs'. " if n>1 else "Section 'Finetuning with LoRA on 1 GPU'. ")+N2))
SRC3 = "Lightning-AI/litgpt:tutorials/finetune_lora.md@26857050fe3ff627cd714fe92f5838f51a3d5efa"
R(source=SRC3, quote="| Default (bf16-mixed) | 26.92 GB | 1.34 min | 21.43 GB |", model="stabilityai/stablelm-base-alpha-3b", gpu="unstated (same runs as resource-tables.md: A100-SXM4-40GB - inferred)",
  n_gpus=1, method="lora", gc="no", sharding="none", offload="none", precision="mixed", batch_per_device=1, grad_accum=128, seq_len="variable (Alpaca)", packing="no",
  lora_rank=8, lora_targets="query,value", attention="sdpa", framework="lit-gpt (Lightning Fabric)", measured=1.34, unit="min per 1000 iterations",
  what_counted="'Training Time' for 1,000 iterations at micro-batch 1",
  notes="Table in finetune_lora.md (added 2023-10-27, commit 0cc02afa): 'StableLM 3B model finetuned with LoRA on Alpaca for 1,000 iterations using a microbatch size of 1'. bf16-mixed = fp32 weights with bf16 autocast. The other rows of this table (bf16-true, nf4, nf4-dq and the Llama 2 7B table) duplicate resource-tables.md and are not repeated. GPU not stated in this file. gc/grad_accum/LoRA settings are script defaults at the time (finetune/lora.py), not stated in the table.")
