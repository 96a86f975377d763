"""Retrieval's host-side pieces, shared by the jobs below which they sit (embed, rerank, mining):
the row files with sentence-transformers' column names (`records`: one reader for every layout;
`pairs`: anchor/positive/negative pairs, featurized), the scores the field reports (`metrics`:
nDCG@10, MRR@10, Recall@k as sentence-transformers' InformationRetrievalEvaluator) and packed
batches of pairs (`packing`). Numpy only: no framework at import."""
