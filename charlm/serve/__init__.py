"""`charlm serve`: the engine that steps every active request together (continuous batching),
the OpenAI-compatible HTTP app around it, and the playground page. FastAPI and uvicorn (the
`serve` extra) are imported only here, never by the rest of charlm."""
