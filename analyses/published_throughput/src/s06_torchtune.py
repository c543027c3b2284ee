from common import R
SRC = "pytorch/torchtune:README.md@bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1"
N1 = ("README 'Memory and training speed' (table added 2024-09-24, commit 30b8519e): 'all the below numbers are provided for batch size 2 (without gradient accumulation), a dataset packed to sequence length 2048, and torch compile enabled'; "
      "'*= Measured over one full training epoch'; '**= Uses CPU offload with fused optimizer'. The table does not name the config, dataset, LoRA rank/targets, optimizer or AC; "
      "it does not say whether multi-GPU Tokens/sec is per GPU or summed (torchtune recipes log tokens_per_second_per_gpu - so per-GPU is likely, inferred). "
      "Precision: torchtune configs use dtype bf16 (pure bf16, no AMP) - default, not restated. Likely configs @30b8519e (not named in the table): ")
T = [("Llama 3.1 8B","Full finetune","1x 4090",1,"full",1650,"NVIDIA GeForce RTX 4090","llama3_1/8B_full_single_device: bitsandbytes PagedAdamW8bit, optimizer_in_bwd True, activation checkpointing True."),
     ("Llama 3.1 8B","Full finetune","1x A6000",1,"full",2579,"NVIDIA RTX A6000","llama3_1/8B_full_single_device: PagedAdamW8bit, optimizer_in_bwd True, AC True. Peak memory 37.4 GiB vs 18.9 GiB on the 4090 under the 'same' stated settings - configs probably differed."),
     ("Llama 3.1 8B","LoRA","1x 4090",1,"lora",3083,"NVIDIA GeForce RTX 4090","llama3_1/8B_lora_single_device: LoRA r8 on q_proj,v_proj, AdamW, AC True."),
     ("Llama 3.1 8B","LoRA","1x A6000",1,"lora",4699,"NVIDIA RTX A6000","llama3_1/8B_lora_single_device: LoRA r8 on q_proj,v_proj, AdamW, AC True. Peak memory 30.3 GiB vs 16.2 GiB on 4090 - settings probably differed (e.g. AC off)."),
     ("Llama 3.1 8B","QLoRA","1x 4090",1,"qlora",2413,"NVIDIA GeForce RTX 4090","llama3_1/8B_qlora_single_device: torchtune NF4 (torchao) base, LoRA r8 on q,k,v,output_proj + MLP, AC True."),
     ("Llama 3.1 70B","Full finetune","8x A100",8,"full",1568,"NVIDIA A100 (variant not stated)","llama3_1/70B_full: FSDP, AdamW, AC True, fsdp_cpu_offload True ('**' CPU offload with fused optimizer)."),
     ("Llama 3.1 70B","LoRA","8x A100",8,"lora",3497,"NVIDIA A100 (variant not stated)","llama3_1/70B_lora: FSDP, LoRA r16 on q,k,v, AdamW, AC True."),
     ("Llama 3.1 405B","QLoRA","8x A100",8,"qlora",653,"NVIDIA A100 (variant not stated)","llama3_1/405B_qlora (lora_finetune_fsdp2): FSDP2, NF4 base, LoRA r16 on q,k,v,output_proj + MLP, AC True.")]
MID = {"Llama 3.1 8B":"meta-llama/Llama-3.1-8B-Instruct (base vs instruct not stated)","Llama 3.1 70B":"meta-llama/Llama-3.1-70B-Instruct (base vs instruct not stated)","Llama 3.1 405B":"meta-llama/Llama-3.1-405B-Instruct (base vs instruct not stated)"}
for model, meth, run, n, m, v, gpu, cfgnote in T:
    R(source=SRC, quote=f"| {model} | {meth} | {run} | ... | {v} |", model=MID[model], gpu=gpu, n_gpus=n, method=m, gc="unstated",
      sharding=("fsdp" if n>1 else "none"), offload=("params+optimizer" if (m=="full" and n==8) else "unstated" if n>1 else "none"), precision="bf16", batch_per_device=2, grad_accum=1, seq_len=2048,
      packing="yes", attention="sdpa", framework="torchtune (torch.compile on)", measured=v, unit="tokens/s", what_counted="'Tokens/sec' measured over one full training epoch (per-GPU vs total not stated)",
      notes=N1 + cfgnote + " attention: torchtune uses torch SDPA (code default, not stated).")
SRC_F = SRC
N2 = ("README 'Optimization flags' (added 2024-11-18, commit 1814feb1): 'Baseline uses Recipe=full_finetune_single_device, Model=Llama 3.2 3B, Batch size=2, Max sequence length=4096, Precision=bf16, Hardware=A100'; "
      "'Each technique is added on top of the previous one, except for LoRA and QLoRA, which do not use optimizer_in_bwd or AdamW8bit optimizer.' "
      "Reproduce command for the QLoRA row: tune run lora_finetune_single_device --config llama3_2/3B_qlora_single_device dataset.packed=True compile=True loss=CEWithChunkedOutputLoss enable_activation_checkpointing=True optimizer_in_bwd=False enable_activation_offloading=True optimizer=torch.optim.AdamW tokenizer.max_seq_len=4096 gradient_accumulation_steps=1 epochs=1 batch_size=2. "
      "Tokens per second = torchtune's logged tokens_per_second_per_gpu (single GPU here); with packing off, tokens counted are those of padded batches (padding to longest in batch). Dataset is the config default (alpaca-cleaned for llama3_2/3B configs - inferred). A100 variant not stated.")
F = [("Baseline","full","no","no","no",2091,"Baseline (full_finetune_single_device defaults with AC/compile/packing off as implied; optimizer not stated)"),
     ("+ Packed Dataset","full","yes","no","no",7075,""),
     ("+ Compile","full","yes","yes","no",8998,""),
     ("+ Chunked Cross Entropy","full","yes","yes","no",9174,""),
     ("+ Activation Checkpointing","full","yes","yes","yes",7210,""),
     ("+ Fuse optimizer step into backward","full","yes","yes","yes",7309,"optimizer_in_bwd True"),
     ("+ Activation Offloading","full","yes","yes","yes",7301,"activation offloading on"),
     ("+ 8-bit AdamW","full","yes","yes","yes",6960,"8-bit AdamW + optimizer_in_bwd + activation offloading"),
     ("LoRA","lora","yes","yes","yes",8210,"LoRA with packing, compile, chunked CE, AC, activation offloading, torch AdamW (no optimizer_in_bwd / 8-bit); rank/targets = llama3_2/3B_lora_single_device config defaults (not stated)"),
     ("QLoRA","qlora","yes","yes","yes",8035,"QLoRA (torchtune NF4) with the reproduce command above; rank/targets = llama3_2/3B_qlora_single_device defaults (not stated)")]
for tech, m, pack, comp, ac, v, extra in F:
    R(source=SRC_F, quote=f"| {tech} | ... | {v} | ...", model="meta-llama/Llama-3.2-3B (Instruct vs base not stated)", gpu="NVIDIA A100 (variant not stated)", n_gpus=1,
      method=m, gc=ac, sharding="none", offload=("none"), precision="bf16", batch_per_device=2, grad_accum=1, seq_len=4096, packing=pack, attention="sdpa",
      framework="torchtune" + (" (torch.compile on)" if comp=="yes" else ""), measured=v, unit="tokens/s",
      what_counted="'Tokens Per Second' column (single GPU)", notes=f"Technique row '{tech}' (cumulative). {extra}. " + N2)
