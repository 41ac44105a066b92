"""Rerank: llama-server's /rerank and /v1/reranking, vLLM's and Jina's /v1/rerank, Cohere's
/v1/rerank and /v2/rerank, and vLLM's /score and /v1/score, one path on a reranker's worker
(actors.rerank)."""
