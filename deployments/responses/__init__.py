"""OpenAI's Responses API: request (with the stored conversation), reply (events -> output
items and semantic stream events), store (finished responses per replica), routes."""
