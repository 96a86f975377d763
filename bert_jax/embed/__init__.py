"""Sentence embeddings: the contrastive training job (`run`: pairs -> an encoder trained with
in-batch negatives on the mesh -> a sentence-transformers directory), its dev retrieval
evaluation (`evaluation`), hard-negative mining (`mining`, `mine`) and the offline demonstration
(`shakespeare`). The pairs, their packing and the retrieval scores are `bert_jax.retrieval`'s."""
