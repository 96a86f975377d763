"""Sentence embeddings: the contrastive training job (`run`: pairs -> an encoder trained with
in-batch negatives on the mesh -> a sentence-transformers directory), its data (`pairs`) and its
dev retrieval evaluation (`evaluation`, scored by `retrieval`)."""
