# huggingface/trl issue #2960 'Maybe some bug in multi gpu training' (Kfkcome, 2025-02-26), the command as
# the issue description gives it (first attempt: CUDA_VISIBLE_DEVICES=0; second: CUDA_VISIBLE_DEVICES=0,2).
export CUDA_VISIBLE_DEVICES=0
export NCCL_P2P_LEVEL="NVL"
accelerate launch --config_file recipes/accelerate_configs/zero3.yaml --num_processes=1 src/open_r1/grpo.py \
    --output_dir DeepSeek-R1-Distill-Qwen-15B-GRPO-new \
    --model_name_or_path /data1/gaoxingjie/model/Qwen2.5-1.5B-Instruct/ \
    --dataset_name data/gsm8k/main \
    --max_prompt_length 512 \
    --max_completion_length 1024 \
    --per_device_train_batch_size 8 \
    --num_generations 8 \
    --lr_scheduler_type cosine \
    --warmup_ratio 0.1 \
    --logging_strategy steps \
    --learning_rate 3.0e-06 \
    --gradient_accumulation_steps 16 \
    --logging_steps 5 \
    --eval_strategy no \
    --bf16 \
    --use_vllm \
    --vllm_device auto \
    --vllm_gpu_memory_utilization 0.3
