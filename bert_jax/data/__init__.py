"""Host-side text data shared by the jobs and inference: encoding texts to features and
batching them.

Modules (numpy, pyarrow and tokenization only; no jax, torch or TensorFlow at import):

    tables    data files where users keep them (Parquet, `datasets` directories, the Hub's layout,
              JSONL/CSV/text; local or gs://), streamed as column batches
    text_io   TextDataset and TextExample, CSV/TSV/JSONL/tfds readers, sentence (pair) features
    batching  batches with length buckets and weight-0 fillers, epochs, packing, unbatching

Fine-tuning's tasks (`bert_jax.finetune`) and `bert_jax.inference` build on them; nothing here
imports either job.
"""
