"""Ollama's API: request (Ollama's body -> OpenAI's -> the worker's typed request), reply
(events -> NDJSON lines or one object; model listings), routes."""
