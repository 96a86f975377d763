"""The reranker (cross-encoder) job: `run` trains and exports, `data` reads the rows,
`objective` scores pairs and names the losses, `evaluation` reranks the dev queries."""
