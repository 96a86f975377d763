"""ELECTRA's names in other formats: the Hugging Face state dict ("electra.encoder.layer.0.
attention.self.query.weight", "discriminator_predictions.dense_prediction.weight",
"generator_lm_head.bias") and google-research/electra's TF checkpoints, which hold both models
of a pretraining run: the discriminator under `electra/` ("electra/encoder/layer_0/attention/
self/query/kernel", "discriminator_predictions/dense_1/kernel"), the generator under `generator/`
("generator/encoder/...", "generator/embeddings_project/...", "generator_predictions/
output_bias") reading the discriminator's embedding tables (`electra/embeddings/...`). Read by
`bert_jax.checkpoints` through the family's row (`families.FAMILIES["electra"].conversion`).

google's checkpoints come without a config file; the TF import reads a Hugging Face
`config.json` of the model it imports (`tf_config_file`, beside the checkpoint or given:
`checkpoints.tf.load_tf`).
"""

from __future__ import annotations

from bert_jax.models.conversion import FamilyConversion, encoder_names

CONVERSION = FamilyConversion(
    # The tables are M (`embedding_size`) wide, not E.
    **encoder_names(
        "electra",
        ("embeddings", "embeddings_project", "encoder"),
        mlm_biases=("generator_lm_head/bias",),
        width="embedding_size",
    ),
    tied_decoder="generator_lm_head.weight",
    two_input_kernels=("attention/output/dense/kernel",),
    tf_config_file="config.json",
    tf_prefix="electra/",
    tf_top_level=(
        "electra/",
        "discriminator_predictions/",
        "generator_predictions/",
        "generator_lm_head/",
        # fine-tuning heads: no TF names of google's (its run_finetuning.py's are its own)
        "classifier/",
        "qa_outputs/",
        "sequence_summary/",
    ),
    tf_renames=(
        (r"^discriminator_predictions/dense_prediction/", "discriminator_predictions/dense_1/"),
        (r"^generator_lm_head/bias$", "generator_predictions/output_bias"),
        (r"/embedding$", ""),
        (r"LayerNorm/scale$", "LayerNorm/gamma"),
        (r"LayerNorm/bias$", "LayerNorm/beta"),
    ),
    tf_default_head="ElectraForPreTraining",
    # The generator's layers and projection are its own; its embeddings are the discriminator's.
    tf_head_renames=(
        ("ElectraForMaskedLM", ((r"^electra/(encoder|embeddings_project)/", r"generator/\1/"),)),
    ),
)
