"""The job service: REST API (OpenAI- and Vertex-compatible), durable job store, workers."""
