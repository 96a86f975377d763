"""Using a trained model of any family on text: embeddings, batch prediction, attention heat
maps, fill-mask. The command line is `python -m bert_jax.inference` (`__main__`).

    from bert_jax import inference
    config, params, head, tokenizer = inference.load("path/to/model", "encoder")
    emb = inference.embed(config, params, tokenizer, ["Fair is foul"], pooling="mean")  # [1, E]

Modules: `loading` (checkpoints, and what each family's modules take, from the registry),
`batches` (input files, encoding, batched runs in input order), `encoder` (embed,
attention_map), `heads` (predict, a cross-encoder's scores, fill_mask), `commands` (the
command line's commands, one module each, and their registry), `bulk` (any command's bulk form
over a corpus of shards, on many processes, as a resumable job).
"""

from bert_jax.inference.batches import (
    PROGRESS_MIN_BATCHES,
    inference_buckets,
    read_texts,
)
from bert_jax.inference.encoder import (
    POOLINGS,
    EmbeddingModel,
    EmbeddingOptions,
    attention_map,
    embed,
    embed_step,
    embedding_options,
    load_for_embedding,
)
from bert_jax.inference.heads import (
    fill_mask,
    logits_step,
    predict,
    token_text,
    top_predictions,
)
from bert_jax.inference.loading import (
    CrossEncoder,
    load,
    load_cross_encoder,
    load_embedder,
    load_masked_lm,
)

__all__ = [
    "POOLINGS",
    "CrossEncoder",
    "EmbeddingModel",
    "EmbeddingOptions",
    "PROGRESS_MIN_BATCHES",
    "attention_map",
    "embed",
    "embed_step",
    "embedding_options",
    "fill_mask",
    "inference_buckets",
    "load",
    "load_cross_encoder",
    "load_for_embedding",
    "load_embedder",
    "load_masked_lm",
    "logits_step",
    "predict",
    "read_texts",
    "token_text",
    "top_predictions",
]
