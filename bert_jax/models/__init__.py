"""The models: every family's encoder and task heads, and what they are built from.

A family is one folder, its rows in its `__init__.py`; only the registry (`families.py`) imports a
family's folder, and the shared modules name no family (`tests/layering_test.py` checks the
imports). The map of this package: docs/architecture.md.

Dimension legend (every module here names array axes by these letters):
  B batch            L sequence length     E hidden size (hidden_size)
  M embedding size (ELECTRA's embedding_size, where it differs from E)
  H attention (query) heads                K key/value heads (grouped-query attention)
  D head size (E / H)                      F intermediate size
  V vocabulary (V' the embedding table's rows, padded: `padded_vocab_size`)
  P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)   N labels
  R relative positions (a family's buckets or table rows)

The encoders' call (every family's `*Model`; its docstring states only what its own differs in):
  input_ids: [B, L] int token ids.
  token_type_ids: [B, L] int segment A/B ids, zeros when omitted (a family without token types
    takes none: its heads' `token_types` is False, and the jobs pass none).
  attention_mask: [B, L] 1 for real tokens, 0 for padding (either side); ones when omitted.
  position_ids: [B, L] int positions counted from 0 in each sequence; 0..L-1 when omitted.
  segment_ids: [B, L] int ids of packed sequences (0 = padding); attention stays inside one.
  cls_positions: [B, S] int position of each packed sequence's first token (pooling only).
  deterministic: False turns dropout on (needs `rngs={"dropout": key}`).
  output_hidden_states / output_attentions: also return every layer's states / probabilities.
It returns an `EncoderOutput`: last_hidden_state [B, L, E]; pooler_output [B, E] ([B, S, E] at
cls_positions) with `add_pooling_layer`, else None; hidden_states L+1 arrays [B, L, E] (the
layers' input first); attentions [B, H, L, L] float32 per layer.
"""
