"""Tokenize and detokenize: llama-server's and vLLM's /tokenize and /detokenize (also under
/v1/), on the model's own tokenizer and chat template (actors.tokenize)."""
