"""Embeddings: OpenAI's /v1/embeddings, Ollama's /api/embed and /api/embeddings, and
llama-server's /embedding (and /embeddings)."""
