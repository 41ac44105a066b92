"""OpenAI's Responses API: request (with the stored conversation), truncation (`"auto"`: the
oldest turns dropped to fit the context), reply (events -> output items and semantic stream
events), items (input items as listed back), store (finished responses per replica), routes."""
