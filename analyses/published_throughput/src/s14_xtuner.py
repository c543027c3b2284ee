from common import R
SRC = "InternLM/xtuner:docs/zh_cn/acceleration/benchmark.rst@7575f2c91"
N = ("Doc '速度基准' (speed benchmark, July 2024): hardware NVIDIA A100-SXM4-80GB, Xeon Gold 6348; Python 3.10, PyTorch 1.13, CUDA 11.7, NCCL 2.14.3; 'TGS = Tokens per GPU per Second'; "
     "'all experiments pack the Alpaca dataset to the maximum length' (dataset enlarged 6x for long sequences). Configs xtuner/configs/llama_speed_benchmark/llama2_7b/*.py @7575f2c9: "
     "meta-llama/Llama-2-7b, batch_size 1 per device, pack_to_max_length True, use_varlen_attn False, AdamW, AmpOptimWrapper dtype 'float16' in config (DeepSpeed config passed on the CLI would override - which ZeRO stage/precision was used is not stated); "
     "xtuner SupervisedFinetune enables activation checkpointing by default (use_activation_checkpointing=True) and FlashAttention-2 for Llama when available (code defaults). "
     "Sequence parallel (SP) splits each sequence across SP GPUs; with SP 8 on 8 GPUs, each GPU holds 1/8 of one sequence and accumulative_counts 8.")
T = [("8k",8192,1,1,3028.3,185.3,"llama2_7b_full_alpaca_enzh_8k_sp1.py"),("32k",32768,1,1,2234.2,193.0,"llama2_7b_full_alpaca_enzh_32k_sp1.py"),
     ("128k",131072,8,8,948.6,180.3,"llama2_7b_full_alpaca_enzh_128k_sp8.py"),("256k",262144,8,8,540.1,176.9,"llama2_7b_full_alpaca_enzh_256k_sp8.py")]
for lab, sl, sp, acc, tgs, tfl, cfg in T:
    R(source=SRC, quote=f"Llama2-7B | 8 | {lab} | {tgs} | {tfl} | {cfg}", model="meta-llama/Llama-2-7b-hf (config: meta-llama/Llama-2-7b)", gpu="NVIDIA A100-SXM4-80GB",
      n_gpus=8, method="full", gc="unstated", sharding="unstated", offload="unstated", precision="unstated", batch_per_device=1, grad_accum=acc, seq_len=sl, packing="yes",
      attention="unstated", framework="XTuner (mmengine + DeepSpeed)", measured=tgs, unit="tokens/s/gpu", what_counted=f"TGS (tokens per GPU per second); TFLOPs {tfl}",
      notes=f"sequence_parallel_size {sp}. The doc's table links the 8k row to a file named llama2_70b_... but the URL is the 7B config. " + N)
