"""Retrieval's pieces, shared by the jobs below which they sit (embed, rerank, mining) and by
inference's `search`: the row files with sentence-transformers' column names (`records`: one
reader for every layout; `pairs`: anchor/positive/negative pairs, featurized), the scores the
field reports (`metrics`: nDCG@10, MRR@10, Recall@k as sentence-transformers'
InformationRetrievalEvaluator), packed batches of pairs (`packing`), exact top-k search
(`search`: on the devices, or by faiss), BM25 (`lexical`, by bm25s) and reciprocal rank fusion
(`fusion`). Numpy only at import: `search` imports JAX when it runs, `lexical` bm25s."""
