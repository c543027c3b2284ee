from common import R
SRC = "QwenLM/Qwen:README.md@2df8e8ac450fa185c421a08b0090ef81826caa6e"
N = ("README 'Profiling of Memory and Speed' (added 2023-10-07 b5fad3d; 1.8B/72B rows 2023-11-30 e8e1596): single A100-SXM4-80G, CUDA 11.8, PyTorch 2.0, 'Flash attention 2 is applied', "
     "'We uniformly use a batch size of 1 and gradient accumulation of 8', speed in s/iter for input lengths 256-8192. With HF Trainer an 'it' is one optimizer step = 8 micro-batches (inferred; the README says s/iter only). "
     "finetune.py pads every sample to model_max_length (preprocess appends pad tokens up to max_len), so each micro-batch is exactly seq_len tokens including padding. "
     "finetune.py defaults: LoRA r 64, alpha 16, targets c_attn,c_proj,w1,w2; optim adamw_torch. Repo scripts (finetune/*.sh) use --gradient_checkpointing and bf16 (LoRA, full) or fp16 (Q-LoRA) - script defaults, not restated in the table.")
HF = {"1.8B":"Qwen/Qwen-1_8B-Chat (base vs chat not stated)","7B":"Qwen/Qwen-7B-Chat (base vs chat not stated)","14B":"Qwen/Qwen-14B-Chat (base vs chat not stated)","72B":"Qwen/Qwen-72B-Chat (base vs chat not stated)"}
L = [256,512,1024,2048,4096,8192]
T = {
 ("1.8B","LoRA",1,1):[1.0,1.0,1.1,1.7,3.3,6.8],
 ("1.8B","LoRA (emb)",1,1):[1.0,1.0,1.1,1.8,3.4,7.0],
 ("1.8B","Q-LoRA",1,1):[1.4,1.4,1.4,2.0,3.4,6.5],
 ("1.8B","Full-parameter",1,1):[2.1,2.2,2.2,2.3,2.8,5.6],
 ("7B","LoRA",1,1):[1.2,1.5,2.8,5.2,10.1,21.3],
 ("7B","LoRA (emb)",1,1):[1.4,1.6,2.9,5.3,10.3,21.7],
 ("7B","Q-LoRA",1,1):[3.0,3.0,3.5,7.0,11.6,22.3],
 ("7B","Full-parameter",1,2):[4.0,4.0,4.5,None,None,None],
 ("7B","LoRA (multinode)",2,2):[2.09,3.16,5.17,9.25,18.1,37.4],
 ("14B","LoRA",1,1):[1.6,2.4,4.4,8.4,17.0,36.0],
 ("14B","LoRA (emb)",1,1):[1.7,2.6,4.6,8.6,17.2,36.3],
 ("14B","Q-LoRA",1,1):[5.3,6.3,8.2,11.8,20.1,38.3],
 ("72B","LoRA + Deepspeed Zero3",1,4):[17.6,20.5,29.4,45.7,83.4,161.5],
 ("72B","Q-LoRA",1,1):[27.4,31.5,41.4,59.5,97.7,179.8],
}
for (size, meth, nodes, gpn), vals in T.items():
    n = nodes*gpn
    for sl, v in zip(L, vals):
        if v is None: continue
        if meth.startswith("Q-LoRA"):
            m = "qlora"; prec = "fp16 (script)"; extra = "Q-LoRA in Qwen v1 = LoRA on the GPTQ Int4 checkpoint (Qwen-*-Chat-Int4, auto-gptq), NOT bnb NF4; finetune_qlora_single_gpu.sh uses --fp16 and DeepSpeed ZeRO-2 config even on 1 GPU."
            model = HF[size].replace("-Chat (", "-Chat-Int4 (")
        elif meth.startswith("Full"):
            m = "full"; prec = "bf16 (script)"; model = HF[size]
            extra = ("Full-parameter on 2 GPUs: README 'full-parameter finetuning with Qwen-7B on 2 A100 GPUs'; finetune/finetune_ds.sh uses DeepSpeed ZeRO-3 (ds_config_zero3.json), bf16, GC - script, not restated. Memory column (e.g. 139.2G) appears to be summed over GPUs."
                     if size=="7B" else "1.8B full-parameter on 1 GPU; DeepSpeed config used not stated (finetune_ds.sh uses ZeRO-3).")
        else:
            m = "lora"; prec = "bf16 (script)"; model = HF[size]
            extra = ""
            if "emb" in meth:
                extra += "LoRA (emb): embedding and output layer also trained; finetune.py sets modules_to_save=['wte','lm_head'] only when the model is not a chat model and not Q-LoRA, so LoRA (emb) rows are probably the base checkpoints (inferred). "
                model = HF[size].replace("-Chat (base vs chat not stated)", " (base checkpoint - inferred from finetune.py)")
            if "multinode" in meth: extra += "Multinode: 2 servers x 2 A100-SXM4-80G, rest as other Qwen-7B experiments (finetune_lora_ds.sh, DeepSpeed ZeRO-2 default config). Memory column appears summed across the 4 GPUs. "
            if "Zero3" in meth: extra += "72B LoRA + DeepSpeed ZeRO-3 on 4 A100-SXM4-80G (finetune_lora_ds.sh --deepspeed finetune/ds_config_zero3.json). Memory column appears summed across GPUs. "
        shard = "zero3" if ("Zero3" in meth or (m=="full" and n==2)) else ("zero2" if "multinode" in meth else ("unstated" if m=="full" else "none"))
        if m == "qlora": shard = "zero2"
        R(source=SRC, quote=f"{size} | {meth} | nodes {nodes} | GPUs/node {gpn} | seq {sl}: .../{v}s/it", model=model, gpu="NVIDIA A100-SXM4-80G", n_gpus=n, method=m,
          gc="unstated", sharding=shard, offload="none" if "Zero3" not in meth else "unstated", precision=prec.split()[0], batch_per_device=1, grad_accum=8, seq_len=sl,
          packing="no", lora_rank=(64 if m!="full" else ""), lora_targets=("c_attn,c_proj,w1,w2" + (" + wte,lm_head trained" if "emb" in meth else "") if m!="full" else ""),
          attention="flash", framework="Qwen finetune.py (HF Trainer + DeepSpeed/PEFT)", measured=v, unit="s/step",
          what_counted="s/iter (HF Trainer iteration = optimizer step of 8 micro-batches of 1 x seq_len padded tokens - inferred)",
          notes=extra + " sharding/precision from repo scripts, not the table; ZeRO-2 on 1 GPU is effectively unsharded. " + N)
