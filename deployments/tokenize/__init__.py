"""Tokenize and detokenize: llama-server's and vLLM's /tokenize and /detokenize (also under
/v1/), vLLM's /tokenizer_info and llama-server's /apply-template, on the model's own
tokenizer and chat template (actors.tokenize)."""
