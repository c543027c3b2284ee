from common import R
N = ("NVIDIA dgxc-benchmarking release v24.11.1 (commit 35a9aec): 'Performance for HF ... fine tuning is measured by train samples per second, which is logged in the .out file' (HF Trainer train_samples_per_second, global over all GPUs); table header '24.02 BF16' (NeMo/PyTorch 24.02 container). "
     "Launch script: accelerate launch --config_file DHS-LLM-Workshop/chat_assistant/sft/training/configs/fsdp_config.yaml (pacman100 workshop SFT script, HF TRL SFTTrainer; FSDP config file not read here - sharding strategy/offload not verified), "
     "dataset ultrachat_200k, --max_seq_len 2048 --packing True --bf16 True --gradient_checkpointing True --use_flash_attn True --use_peft_lora True --lora_r 8 --lora_alpha 16 --lora_dropout 0.1 "
     "--lora_target_modules q,k,v,o,down,up,gate --num_train_epochs 1 (eval+save each epoch). Only the 8-GPU column is recorded (16-512 GPU columns omitted).")
R(source="NVIDIA/dgxc-benchmarking:hf-llama2/README_70b.md@35a9aec", quote="| Training samples per second | 1.247 | (LLAMA2 70b 24.02 BF16, 8x H100 GPUs)", model="meta-llama/Llama-2-70b-hf",
  gpu="NVIDIA H100 80GB", n_gpus=8, method="lora", gc="yes", sharding="fsdp", offload="unstated", precision="bf16", batch_per_device=8, grad_accum=4, seq_len=2048, packing="yes",
  lora_rank=8, lora_targets="q,k,v,o,gate,up,down", attention="flash", framework="HF Transformers/TRL SFTTrainer + PEFT + accelerate FSDP", measured=1.247, unit="samples/s",
  what_counted="HF Trainer train_samples_per_second (global; a sample = one packed 2048-token sequence)", notes=N)
R(source="NVIDIA/dgxc-benchmarking:hf-mistral/README_7b.md@35a9aec", quote="| Training samples per second | 16.287 | (Mistral 7b 24.02 BF16, 8x H100 GPUs)", model="mistralai/Mistral-7B-v0.1",
  gpu="NVIDIA H100 80GB", n_gpus=8, method="lora", gc="yes", sharding="fsdp", offload="unstated", precision="bf16", batch_per_device=16, grad_accum=4, seq_len=2048, packing="yes",
  lora_rank=8, lora_targets="q,k,v,o,gate,up,down", attention="flash", framework="HF Transformers/TRL SFTTrainer + PEFT + accelerate FSDP", measured=16.287, unit="samples/s",
  what_counted="HF Trainer train_samples_per_second (global; a sample = one packed 2048-token sequence)", notes=N.replace("Llama", "Mistral"))
