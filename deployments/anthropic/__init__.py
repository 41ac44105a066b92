"""Anthropic's Messages API: request (content blocks -> the worker's typed chat request),
reply (events -> content blocks, SSE events or one message), routes."""
