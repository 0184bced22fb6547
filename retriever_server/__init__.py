"""retriever_server package."""
