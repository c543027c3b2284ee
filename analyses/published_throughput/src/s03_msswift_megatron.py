from common import R
SRC = "modelscope/ms-swift:docs/source_en/Megatron-SWIFT/Quick-start.md@3602360a562313afbf2ef6065fdf61f271a2c5b9"
N = ("Doc: 'training speed comparison for full-parameter dense models with 8K context length, using megatron sft and swift sft, under a single-node, eight-GPU A800 environment'. "
     "Table first published 2025-03-21 (commit 9d297f99, docs/source_en/Instruction/Megatron-SWIFT-Training.md) with the same numbers. "
     "DeepSpeed script examples/train/megatron/benchmark/deepspeed.sh @9d297f99: swift sft --model Qwen/Qwen2.5-14B --train_type full --dataset liucong/Chinese-DeepSeek-R1-Distill-data-110k-SFT --torch_dtype bfloat16 --max_steps 2000 "
     "--per_device_train_batch_size 1 --gradient_accumulation_steps 2 --packing true --max_length 8192 --attn_impl flash_attn --deepspeed zero2|zero3 (global batch 16 packed sequences). "
     "gradient_checkpointing not given in script (swift default is true - inferred). 'it' = one HF Trainer optimizer step (2 micro-batches per GPU). Wall-clock per step; includes nothing about eval.")
for z, v, mem in [("zero2",10.32,"8*80GB"),("zero3",10.56,"8*58GB")]:
    R(source=SRC, quote=f"| Training Speed | 9.04s/it | 10.32s/it | 10.56s/it | (Deepspeed-{z.upper()} column; memory {mem})", model="Qwen/Qwen2.5-14B",
      gpu="A800 (80GB)", n_gpus=8, method="full", gc="unstated", sharding=z, offload="none", precision="bf16", batch_per_device=1, grad_accum=2, seq_len=8192,
      packing="yes", attention="flash", framework="ms-swift (swift sft, HF Trainer + DeepSpeed)", measured=v, unit="s/step",
      what_counted="seconds per optimizer step (tqdm s/it) over the run", notes=N)
R(source=SRC, quote="| Training Speed | 9.04s/it | ... (Megatron-LM column; memory 8*64GB)", model="Qwen/Qwen2.5-14B", gpu="A800 (80GB)", n_gpus=8, method="full",
  gc="yes", sharding="unstated", offload="none", precision="bf16", batch_per_device=1, grad_accum=2, seq_len=8192, packing="yes", attention="flash",
  framework="Megatron-SWIFT (megatron sft, Megatron-Core)", measured=9.04, unit="s/step", what_counted="seconds per iteration (one global batch of 16)",
  notes="Megatron side per examples/train/megatron/base_to_chat.sh @9d297f99 (header '# 8 * 65GiB'): tensor_model_parallel_size 4, sequence_parallel true, micro_batch_size 1, global_batch_size 16 (so DP=2 and 8 micro-batches per DP rank per iteration; grad_accum column derived as 16/(1*2)), packing, max_length 8192, recompute_granularity selective (gc=yes means selective recompute), use_flash_attn, Megatron distributed optimizer (ZeRO-1-like, swift default). Not a ZeRO/FSDP setup. " + N)
import common
common.ROWS[-1]["grad_accum"] = "8 (global 16 / micro 1 / DP 2)"
