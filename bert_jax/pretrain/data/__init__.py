"""BERT pretraining data: example creation, record files and the grain pipeline.

Each module is a leaf: none imports the model or the training code (the list:
docs/architecture.md). Nothing is imported here, so importing one module does not pull in grain.
Tokenization is `bert_jax.tokenization` (shared with fine-tuning and inference).
"""
