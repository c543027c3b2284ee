from common import R
C = "0a2c397393e2f0085e58476887d5e1d5af294cb0"
SRC = f"unslothai/unsloth:README.md@{C}"
BLOG = ("unsloth.ai/blog/mistral-benchmark (Dec 14 2023, pages corpus) says these are QLoRA runs: 'You can now QLoRA finetune Mistral 7B 2.2x on 1x A100 faster with 62% less memory or 12.4GB peak VRAM. CodeLlama 34B is 1.9x faster on 1x A100, using 32% less memory or 27GB peak VRAM' - "
        "matching the README rows (12465 MB, 27413 MB). Exact settings (steps, batch, rank, max length) are only in the linked Colab/Kaggle notebooks, which are not available here. "
        "'Flash Attention 2' column = HF + FA2 (or SDPA on T4). Unsloth Pro/Equal/Max columns are closed-source and not recorded. README tables first added 2023-12-01..14 (commits 7d4e2501, d6fdf151); read at the last commit before their removal (0a2c3973, Jan 2025).")
PR = (" HF blog draft (huggingface/blog PR #1726, 2024-01-08, unsloth-trl.md review thread, issues corpus) had an absolute-time table: 'Llama-2 7b | OASST | T4 | 2222 | 1355 (1.64x)', 'Llama-2 7b | Alpaca | T4 | 1468 | 942 (1.56x)', "
      "'Mistral 7b | Slim Orca | A100 | 1571 | 842', 'Code Llama 34b | Slim Orca | A100 | 1982 | 1042' (columns PEFT + TRL Time | Unsloth Time) and states 'QLoRA was applied to all linear layers (attention and MLP) with a rank of 16, and gradient checkpointing was on' for the 59 benchmark runs; "
      "the published blog (Transformers 4.36 with SDPA, PyTorch 2.1.1) keeps only relative speeds. So lora_rank 16 / all-linear / gc=yes below come from that blog text, not from the README.")
def row(quote, model, gpu, n, fw, attn, v, tbl, extra=""):
    R(source=SRC, quote=quote, model=model, gpu=gpu, n_gpus=n, method="qlora", gc="yes", sharding=("ddp" if n>1 else "none"), offload="none",
      precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated", lora_rank=16, lora_targets="all linear (q,k,v,o,gate,up,down)",
      attention=attn, framework=fw, measured=v, unit="s total", what_counted=f"'seconds' row of the '{tbl}' table (total time of the benchmark notebook's training run)",
      notes=(extra+" " if extra else "") + BLOG + PR)
A = "NVIDIA A100 40GB"
row("| seconds| 1040 | 1001 | 525 | ... (1 A100 40GB, Alpaca; Hugging Face column)", "unstated (Llama-family 7B per blog headline 'Llama 7B 1xA100 2.2x faster' - inferred)", A, 1, "HF Transformers + PEFT + bnb", "unstated", 1040, "1 A100 40GB / Alpaca", "Hugging Face baseline column.")
row("| seconds| 1040 | 1001 | 525 | ... (Flash Attention 2 column)", "unstated (Llama-family 7B - inferred)", A, 1, "HF Transformers + PEFT + bnb", "flash", 1001, "1 A100 40GB / Alpaca")
row("| seconds| 1040 | 1001 | 525 | ... (Unsloth Open column)", "unstated (Llama-family 7B - inferred)", A, 1, "unsloth (open source, Dec 2023)", "flash", 525, "1 A100 40GB / Alpaca")
row("| seconds | 1813 | 1571 | 842 | ... (Mistral 7B Slim Orca; Hugging Face column)", "mistralai/Mistral-7B-v0.1", A, 1, "HF Transformers + PEFT + bnb", "unstated", 1813, "1 A100 40GB / Mistral 7B Slim Orca")
row("| seconds | 1813 | 1571 | 842 | ... (Flash Attention 2 column)", "mistralai/Mistral-7B-v0.1", A, 1, "HF Transformers + PEFT + bnb", "flash", 1571, "1 A100 40GB / Mistral 7B Slim Orca")
row("| seconds | 1813 | 1571 | 842 | ... (Unsloth Open column)", "mistralai/Mistral-7B-v0.1", A, 1, "unsloth (open source, Dec 2023)", "flash", 842, "1 A100 40GB / Mistral 7B Slim Orca")
row("| seconds | 1953 | 1982 | 1043 | ... (Code Llama 34B; Hugging Face column, listed as 'OOM' in the speed row)", "codellama/CodeLlama-34b-hf", A, 1, "HF Transformers + PEFT + bnb", "unstated", 1953, "1 A100 40GB / Code Llama 34B", "The relative-speed row says 'OOM' for Hugging Face but the seconds row gives 1953 and memory 40000 MB - ambiguous, treat with care.")
row("| seconds | 1953 | 1982 | 1043 | ... (Flash Attention 2 column)", "codellama/CodeLlama-34b-hf", A, 1, "HF Transformers + PEFT + bnb", "flash", 1982, "1 A100 40GB / Code Llama 34B")
row("| seconds | 1953 | 1982 | 1043 | ... (Unsloth Open column)", "codellama/CodeLlama-34b-hf", A, 1, "unsloth (open source, Dec 2023)", "flash", 1043, "1 A100 40GB / Code Llama 34B")
T4 = "NVIDIA Tesla T4 16GB"
row("| seconds | 1599 | 1468 | 942 | ... (1 T4, Alpaca; Hugging Face column)", "unstated (Llama-family 7B per blog 'Llama 7B 1xT4 2x faster' - inferred)", T4, 1, "HF Transformers + PEFT + bnb", "unstated", 1599, "1 Tesla T4 / Alpaca")
row("| seconds | 1599 | 1468 | 942 | ... ('Flash Attention' column; T4 has no FA2 - likely SDPA/xformers)", "meta-llama/Llama-2-7b-hf (per HF blog PR #1726 draft: 'Llama-2 7b | Alpaca | T4 | 1468')", T4, 1, "HF Transformers + TRL + PEFT + bnb (SDPA)", "unstated", 1468, "1 Tesla T4 / Alpaca", "On T4 the 'Flash Attention' column cannot be FA2 (Turing); SDPA is the likely meaning (inferred).")
row("| seconds | 1599 | 1468 | 942 | ... (Unsloth Open column)", "meta-llama/Llama-2-7b-hf (per HF blog PR #1726 draft: 'Llama-2 7b | Alpaca | T4 | ... | 942')", T4, 1, "unsloth (open source, Dec 2023)", "unstated", 942, "1 Tesla T4 / Alpaca")
row("| seconds | 9882 | 9946 | 1996 | ... (2 T4 DDP, Alpaca; Hugging Face column)", "unstated (Llama-family 7B per blog 'Llama 7B 2xT4' - inferred)", T4, 2, "HF Transformers + PEFT + bnb (DDP)", "unstated", 9882, "2 Tesla T4s via DDP / Alpaca", "Kaggle 2xT4 notebooks.")
row("| seconds | 9882 | 9946 | 1996 | ... (Flash Attention column)", "unstated (Llama-family 7B - inferred)", T4, 2, "HF Transformers + PEFT + bnb (DDP)", "unstated", 9946, "2 Tesla T4s via DDP / Alpaca", "Kaggle 2xT4 notebooks.")
row("| seconds | 9882 | 9946 | 1996 | ... (Unsloth Open column)", "unstated (Llama-family 7B - inferred)", T4, 2, "unsloth (open source, Dec 2023) DDP", "unstated", 1996, "2 Tesla T4s via DDP / Alpaca", "Kaggle 2xT4 notebooks. Note: unsloth open source officially did not support multi-GPU; treat with care.")
# 1-epoch tables
EP = ("'Time taken for 1 epoch'. Settings stated: bsz = 2, ga = 4, max_grad_norm = 0.3, num_train_epochs = 1, seed = 3047, lr = 2e-4, wd = 0.01, optim = 'adamw_8bit', schedule = 'linear', schedule_steps = 10. "
      "Model, LoRA rank and max length not stated in the table (a 7B Llama-family QLoRA per blog - inferred). SlimOrca 2xT4 rows use bsz=1.")
def ep(quote, gpu, n, fw, hours, ds, extra=""):
    R(source=SRC, quote=quote, model="unstated (7B Llama-family QLoRA - inferred)", gpu=gpu, n_gpus=n, method="qlora", gc="unstated", sharding=("ddp" if n>1 else "none"),
      offload="none", precision="unstated", batch_per_device=(1 if "SlimOrca" in ds and n==2 else 2), grad_accum=4, seq_len="unstated", packing="unstated",
      attention="unstated", framework=fw, measured=hours, unit="hours total", what_counted=f"time for 1 epoch of {ds} (converted h+m to hours: source value in quote)",
      notes=(extra+" " if extra else "") + EP + " " + BLOG)
for ds, h, m in [("Alpaca (52K)",23,15),("LAION OIG (210K)",56,28),("Open Assistant (10K)",8,38),("SlimOrca (518K)",391,41)]:
    ep(f"| Huggingface | 1 T4 | ... {ds}: {h}h {m}m |", T4, 1, "HF Transformers + PEFT + bnb", round(h+m/60,4), ds, "Google Colab T4.")
for ds, h, m in [("Alpaca (52K)",13,7),("LAION OIG (210K)",31,47),("Open Assistant (10K)",4,27),("SlimOrca (518K)",240,4)]:
    ep(f"| Unsloth Open | 1 T4 | ... {ds}: {h}h {m}m |", T4, 1, "unsloth (open source, Dec 2023)", round(h+m/60,4), ds, "Google Colab T4.")
for ds, h, m in [("Alpaca (52K)",84,47),("LAION OIG (210K)",163,48),("Open Assistant (10K)",30,51),("SlimOrca (518K)",1301,24)]:
    ep(f"| Huggingface | 2 T4 | ... {ds}: {h}h {m}m |", T4, 2, "HF Transformers + PEFT + bnb (DDP)", round(h+m/60,4), ds, "Kaggle 2xT4; HF 2-GPU time is ~3.6x slower than 1 GPU in the source's own numbers - treat with care.")

S2 = "https://github.com/huggingface/blog/pull/1726"
for fw, v in [("HF Transformers 4.36 + TRL + PEFT + bnb (SDPA) ['PEFT + TRL Time']", 2222), ("unsloth (open source, Jan 2024) ['Unsloth Time']", 1355)]:
    R(source=S2, quote="| Llama-2 7b | OASST | T4 | 2222 | 1355 (1.64x) | 10.4GB | 8.4GB |", model="meta-llama/Llama-2-7b-hf", gpu="NVIDIA Tesla T4 16GB (free Colab)", n_gpus=1,
      method="qlora", gc="yes", sharding="none", offload="none", precision="unstated", batch_per_device="unstated", grad_accum="unstated", seq_len="unstated", packing="unstated",
      lora_rank=16, lora_targets="all linear (attention and MLP)", attention="unstated", framework=fw, measured=v, unit="s total",
      what_counted="time column of the draft benchmark table (total time of the benchmark notebook's run; seconds implied)",
      notes="Draft text of the HF blog 'Make LLM Fine-tuning 2x faster with Unsloth and TRL' in huggingface/blog PR #1726 (review thread on unsloth-trl.md, 2024-01-08, issues corpus); the merged post only shows relative speed (1.95x for Llama-2 7b OASST on T4 vs a 1x 'Hugging Face' baseline, 1.19x for 'Pytorch 2.1.1'). "
            "Blog: 'QLoRA was applied to all linear layers (attention and MLP) with a rank of 16, and gradient checkpointing was on'; free Colab T4 (PyTorch 2.1.0, CUDA 12.1). Steps/batch/max length per notebook, not stated. Units not written in the table (seconds, consistent with the unsloth README tables).")
