from common import R
SRC = "ljm565/universal-llm-trainer:docs/gpu_test.md@aefdc4a4982c8e9e186d4169aa5b902db1067a52"
MODELS = {"Llama 3.1 8B":"meta-llama/Llama-3.1-8B (exact checkpoint per config/llm_llama3.1_*.yaml; base vs instruct not stated)",
          "Llama 3 8B":"meta-llama/Meta-Llama-3-8B (per config/llm_llama3_*.yaml; base vs instruct not stated)",
          "Llama 2 13B":"meta-llama/Llama-2-13b (per config/llm_llama2_*.yaml)", "Gemma 2 9B":"google/gemma-2-9b", "Gemma 7B":"google/gemma-7b",
          "Phi3-mini (3.8B)":"microsoft/Phi-3-mini (3.8B; 4k vs 128k variant not stated)", "Qwen 3 8B":"Qwen/Qwen3-8B"}
H100 = [("Llama 3.1 8B","Full",1,4.7),("Llama 3.1 8B","LoRA",1,6.4),("Llama 3.1 8B","QLoRA",1,26.1),("Llama 3.1 70B","LoRA*",2,40.2),
        ("Llama 3 8B","Full",1,4.7),("Llama 3 8B","LoRA",1,6.4),("Llama 3 8B","QLoRA",1,26.1),("Llama 2 13B","Full*",2,9.5),
        ("Llama 2 13B","LoRA",1,9.8),("Llama 2 13B","QLoRA",1,43.0),("Gemma 2 9B","Full*",2,12.6),("Gemma 2 9B","LoRA",1,12.9),
        ("Gemma 7B","Full*",2,8.7),("Gemma 7B","LoRA",1,9.5),("Gemma 7B","QLoRA",1,27.4),("Phi3-mini (3.8B)","Full",1,4.0),
        ("Phi3-mini (3.8B)","LoRA",1,5.0),("Phi3-mini (3.8B)","QLoRA",1,17.6)]
PRO = [("Llama 3.1 8B","Full",1,10.9),("Llama 3.1 8B","LoRA",1,12.5),("Llama 3.1 8B","QLoRA",1,30.7),("Llama 3.1 70B","LoRA*",2,82.7),
        ("Llama 3 8B","Full",1,10.9),("Llama 3 8B","LoRA",1,12.5),("Llama 3 8B","QLoRA",1,30.7),("Llama 2 13B","Full*",2,22.3),
        ("Llama 2 13B","LoRA",1,19.6),("Llama 2 13B","QLoRA",1,52.0),("Gemma 2 9B","Full*",2,18.9),("Gemma 2 9B","LoRA",1,17.2),("Gemma 2 9B","QLoRA",1,40.3),
        ("Gemma 7B","Full*",2,13.5),("Gemma 7B","LoRA",1,13.1),("Gemma 7B","QLoRA",1,33.2),("Phi3-mini (3.8B)","Full",1,8.0),
        ("Phi3-mini (3.8B)","LoRA",1,9.2),("Phi3-mini (3.8B)","QLoRA",1,20.7)]
A100 = [("Llama 3.1 8B","Full",1,9.7),("Llama 3.1 8B","LoRA",1,11.5),("Llama 3.1 8B","QLoRA",1,57.6),("Llama 3.1 70B","LoRA*",2,84.1),
        ("Llama 3 8B","Full",1,9.7),("Llama 3 8B","LoRA",1,11.5),("Llama 3 8B","QLoRA",1,57.6),("Llama 2 13B","Full*",2,25.4),
        ("Llama 2 13B","LoRA",1,17.9),("Llama 2 13B","QLoRA",1,96.5),("Gemma 2 9B","Full*",2,25.2),("Gemma 2 9B","LoRA",1,20.0),
        ("Gemma 7B","Full*",2,18.5),("Gemma 7B","LoRA",1,14.7),("Gemma 7B","QLoRA",1,61.5),("Phi3-mini (3.8B)","Full",1,7.4),
        ("Phi3-mini (3.8B)","LoRA",1,8.5),("Phi3-mini (3.8B)","QLoRA",1,36.1),("Qwen 3 8B","Full",1,10.9),("Qwen 3 8B","LoRA",1,12.5),("Qwen 3 8B","QLoRA",1,60.7)]
COMMON = ("Doc conditions: batch size 2, sequence length 8,192 'Without padding, fully filled tokens', torch.bfloat16 model, torch.optim.AdamW, "
          "w/ gradient checkpointing (tested with both torch and HF checkpointing), gradient accumulation Full 1 / LoRA 32. '*' rows: 'FSDP training with CPU offloading + 32 gradient accumulation'. "
          "'**' QLoRA rows: 4-bit; config_quant/bnb_4bit.yaml: nf4, double quant True, compute dtype bf16. LoRA config config_lora/llm_lora_config.yaml: r 8, alpha 16, dropout 0.05, q,k,v,o,gate,up,down. "
          "STEP AMBIGUITY: 'Sec/step' is not defined in the doc. In src/trainer/trainer.py each loop iteration is one micro-batch forward+backward (optimizer steps every gradient_accumuate_step iterations), and in gpu_test mode the batch is random token ids of full length; so Sec/step is most likely seconds per micro-batch of 2x8192 tokens, NOT per optimizer step (inferred from code). "
          "Full FT on 1 GPU fits 78 GiB with bf16 weights + torch AdamW, i.e. pure-bf16 optimizer states (amp_training False in configs). attn_implementation null in configs (transformers default, sdpa in 4.49 - inferred). "
          "Llama 3 8B and Llama 3.1 8B rows are identical numbers in every table.")
def add(tab, gpu, env):
    for model, meth, n, v in tab:
        star = meth.endswith("*"); m = meth.rstrip("*").lower()
        method = {"full":"full","lora":"lora","qlora":"qlora"}[m]
        R(source=SRC, quote=f"| {model} | {meth.rstrip('*')}{' *' if star else ''} | {gpu} x {n} | ... | {v} |",
          model=MODELS.get(model, "meta-llama/Llama-3.1-70B" if "70B" in model else model), gpu=gpu, n_gpus=n, method=method, gc="yes",
          sharding=("fsdp" if star else "none"), offload=("params+optimizer" if star else "none"), precision="bf16", batch_per_device=2,
          grad_accum=(32 if (star or method!="full") else 1), seq_len=8192, packing="yes",
          lora_rank=(8 if method!="full" else ""), lora_targets=("q,k,v,o,gate,up,down" if method!="full" else ""), attention="unstated",
          framework="universal-llm-trainer (custom PyTorch loop)", measured=v, unit="s/step",
          what_counted="'Sec/step' column (see notes: most likely per micro-batch of 2 x 8192 tokens)",
          notes=env + " " + COMMON + (" FSDP cpu_offload True (fsdp_hyperparameters.cpu_offload) and amp_training True inside fsdp_hyperparameters, size_based wrap min_num_params 10000 - from config file; 'offload' set from the doc footnote 'FSDP training with CPU offloading' (which parts are offloaded is FSDP CPUOffload = params, grads and optimizer step on CPU)." if star else "")
                + (" packing=yes here means sequences are 'fully filled' 8192 tokens (no padding), per doc." ))
add(H100, "NVIDIA H100", "Table '1. NVIDIA H100' (Ubuntu 22.04.4, torch 2.5.1, transformers 4.49.0). H100 variant (SXM/PCIe) not stated.")
add(PRO, "NVIDIA RTX Pro 6000", "Table '2. NVIDIA RTX Pro 6000' (torch 2.8.0, transformers 4.49.0, bitsandbytes 0.46.1). Blackwell RTX Pro 6000 (96GB) - variant not stated.")
add(A100, "NVIDIA A100", "Table '3. NVIDIA A100' (torch 2.5.1, transformers 4.49.0). A100 memory variant not stated (78-80 GiB peaks imply 80GB).")
