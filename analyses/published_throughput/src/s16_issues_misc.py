from common import R
# DeepSpeed issue 3901
S = "https://github.com/deepspeedai/DeepSpeed/issues/3901"
N = ("Issue 'Training speed is slower and consumes more memory than FSDP' (2023-07-07, read via the issues corpus excerpt): 'Falcon-7B 4k context length fine-tuning, 8xA100 40GB GPUs', table 'Speed | FSDP 2.93 seconds | Stage-2 - | Stage-2 offload optimizer and params 9.60 seconds | Stage-3 2.86 seconds | Stage-3 offload params 6.05 seconds | Stage-3 offload optimizer and params 13.70 seconds'. "
     "Full fine-tuning implied ('fine-tuning', FSDP vs ZeRO). Batch size, GC, precision and the exact meaning of 'Speed' (most likely seconds per training step) are in the attached zip, not in the text I could read. Stage-2 OOM. "
     "Note 'Stage-2 offload optimizer and params': ZeRO-2 cannot offload params; recorded as the author wrote it.")
for lab, sh, off, v in [("FSDP","fsdp","none",2.93),("Stage-2 offload optimizer and params","zero2","params+optimizer",9.60),
                        ("Stage-3","zero3","none",2.86),("Stage-3 offload params","zero3","params",6.05),("Stage-3 offload optimizer and params","zero3","params+optimizer",13.70)]:
    R(source=S, quote=f"Speed | {lab}: {v} seconds", model="tiiuae/falcon-7b", gpu="NVIDIA A100 40GB", n_gpus=8, method="full", gc="unstated", sharding=sh, offload=off,
      precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len=4096, packing="unstated", attention="unstated",
      framework=("HF accelerate FSDP" if sh=="fsdp" else "DeepSpeed (via HF)"), measured=v, unit="s/step", what_counted="'Speed' in seconds (per step - inferred)", notes=N)
# ColossalAI issue 4342 / 4311
S2 = "https://github.com/hpcaitech/ColossalAI/issues/4342"
R(source=S2, quote="'when i use zero3 with batch size 8, i can get throughout 64.101samples/sec in deepspeed(The seq len is 512 too)' on 'A800 80G*8'", model="LLaMA 7B (exact checkpoint not stated)",
  gpu="NVIDIA A800 80GB", n_gpus=8, method="full", gc="unstated", sharding="zero3", offload="unstated", precision="unstated", batch_per_device=8, grad_accum="unstated", seq_len=512,
  packing="unstated", attention="unstated", framework="DeepSpeed", measured=64.101, unit="samples/s", what_counted="throughput in samples/sec as reported by the user (global, all 8 GPUs - inferred)",
  notes="User report (2023-07-27; same text in issue #4311 comments). Comparison to ColossalAI's examples/language/llama2 benchmark (best 52.67 samples/s after tuning, plugin/settings in #4311). 'batch size 8' probably per GPU (not explicit). GC/precision not stated. Model training from the ColossalAI llama benchmark context = full-parameter training.")
R(source=S2, quote="'I tuned the benchmark in llama 7B with A800 80G*8 and got the best throughout 52.67 samples/sec.'", model="LLaMA 7B (ColossalAI benchmark config '7b')",
  gpu="NVIDIA A800 80GB", n_gpus=8, method="full", gc="unstated", sharding="unstated", offload="unstated", precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len=512,
  packing="unstated", attention="unstated", framework="ColossalAI examples/language/llama2/benchmark.py", measured=52.67, unit="samples/s", what_counted="best throughput in samples/sec after tuning (user report)",
  notes="User report; plugin (gemini / zero2 / hybrid) and batch size of the best run not stated in the text I could read. Seq len 512 per 'The seq len is 512 too'.")
# Stanford Alpaca
S3 = "https://crfm.stanford.edu/2023/03/13/alpaca.html"
R(source=S3, quote="'Fine-tuning a 7B LLaMA model took 3 hours on 8 80GB A100s, which costs less than $100 on most cloud compute providers.'", model="LLaMA-7B (original Meta LLaMA 1)",
  gpu="NVIDIA A100 80GB", n_gpus=8, method="full", gc="unstated", sharding="fsdp", offload="none", precision="bf16", batch_per_device="unstated", grad_accum="unstated", seq_len=512,
  packing="no", attention="unstated", framework="HF Trainer + PyTorch FSDP (stanford_alpaca train.py)", measured=3, unit="hours total",
  what_counted="wall time of the full fine-tuning run (3 epochs over 52K examples per README hyperparameters)",
  notes="CRFM blog (2023-03-13): 'fine-tuned the LLaMA models using Hugging Face's training framework, taking advantage of techniques like Fully Sharded Data Parallel and mixed precision training'. "
        "Hyperparameters from tatsu-lab/stanford_alpaca README@761dc5bf: batch size 128 (global), lr 2e-5, 3 epochs, max length 512, weight decay 0; example command (for 4 A100 80G) uses --bf16 True --fsdp 'full_shard auto_wrap' --per_device_train_batch_size 4 --gradient_accumulation_steps 8 --tf32 True. "
        "The 8-GPU per-device batch / GA used for the 3-hour run is not stated (global 128). Samples are padded per batch (dynamic padding to longest, max 512) - from train.py, not stated in blog. 'Initial run' per blog. Approximate ('3 hours').")
# DeepSpeed-Chat step 1
S4 = "microsoft/DeepSpeedExamples:applications/DeepSpeed-Chat/README.md@00906a774e1586a69fa735fb7f8fb41b9b3aa065"
N4 = ("DeepSpeed-Chat README E2E time breakdown tables; Step 1 = supervised fine-tuning. Step-1 scripts (training_scripts/single_gpu/run_1.3b.sh, single_node/run_13b.sh - versions read may differ from the ones used for the table) "
      "pass --lora_dim 128 WITHOUT --only_optimize_lora, so all weights are trained plus LoRA branches (so 'full' here); run_13b.sh: 6 RLHF datasets (Dahoas/rm-static etc.) with data_split 2,4,4 (20% for step 1), per_device_train_batch_size 4, max_seq_len 512, num_train_epochs 2, gradient_checkpointing, zero_stage 3; "
      "run_1.3b.sh (single GPU): gradient_accumulation_steps 2, zero_stage 0, other args default. Settings not restated next to the table - treat as approximate.")
R(source=S4, quote="| Actor: OPT-1.3B  Reward: OPT-350M | 2900 Sec | 670 Sec | 1.2hr | 2.2hr | (A6000-48G)", model="facebook/opt-1.3b", gpu="NVIDIA RTX A6000 48GB", n_gpus=1, method="full",
  gc="unstated", sharding="none", offload="none", precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated", attention="unstated",
  framework="DeepSpeed-Chat step1 (DeepSpeed)", measured=2900, unit="s total", what_counted="Step 1 (SFT) wall time in the E2E breakdown table", notes=N4)
R(source=S4, quote="| Actor: OPT-13B Reward: OPT-350M | 2.5hr | 0.25hr | 10.8hr | 13.6hr | (single DGX node, 8 NVIDIA A100-40G)", model="facebook/opt-13b", gpu="NVIDIA A100 40GB (DGX)", n_gpus=8, method="full",
  gc="unstated", sharding="unstated", offload="none", precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated", attention="unstated",
  framework="DeepSpeed-Chat step1 (DeepSpeed)", measured=2.5, unit="hours total", what_counted="Step 1 (SFT) wall time in the E2E breakdown table", notes=N4)
