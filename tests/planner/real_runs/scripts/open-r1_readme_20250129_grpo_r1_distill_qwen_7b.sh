# huggingface/open-r1 README.md 'GRPO' section as quoted in huggingface/open-r1 issue #100 (iamansinha,
# 2025-01-29), verbatim; configs/zero3.yaml is accelerate's DeepSpeed ZeRO-3 config with num_processes: 8.
accelerate launch --config_file configs/zero3.yaml src/open_r1/grpo.py \
    --output_dir DeepSeek-R1-Distill-Qwen-7B-GRPO \
    --model_name_or_path deepseek-ai/DeepSeek-R1-Distill-Qwen-7B \
    --dataset_name AI-MO/NuminaMath-TIR \
    --max_prompt_length 256 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 16 \
    --logging_steps 10 \
    --bf16
