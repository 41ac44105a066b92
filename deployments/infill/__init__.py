"""Fill in the middle: llama-server's /infill (llama.vscode's, llama.vim's code completion),
the gap laid out in the model's FIM tokens by the worker (actors.infill). OpenAI's
`suffix` on /v1/completions and Ollama's on /api/generate take the same worker path."""
