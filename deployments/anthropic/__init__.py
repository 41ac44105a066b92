"""Anthropic's Messages API: request (content blocks -> the worker's typed chat request),
reply (events -> content blocks, SSE events or one message), routes; errors (Anthropic's
error shape with its request id), partial (a cut tool call's input), models (the Models
API's shape for the listing's routes)."""
