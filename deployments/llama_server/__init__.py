"""llama-server's own completion API (not OpenAI's): /completion (SillyTavern's and scripts'
llama.cpp backends) and /infill (fill in the middle: llama.vim, llama.vscode), answered in
its own shape. The worker lays out a fill-in-the-middle prompt (actors.infill); OpenAI's
`suffix` on /v1/completions and Ollama's on /api/generate take the same worker path."""
