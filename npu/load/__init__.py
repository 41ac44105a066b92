"""npu.load: a model from disk: config, safetensors or GGUF weights, tokenizer, chat template,
and the generated test model flm-tiny."""
