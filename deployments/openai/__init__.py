"""OpenAI's chat completions and completions: request (wire schema -> the worker's typed
request), reply (events -> SSE chunks or one body), routes."""
