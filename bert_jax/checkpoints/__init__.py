"""Checkpoints in and out: one module per on-disk format, every path through `etils.epath` (a
local path or a URL such as gs://...).

  table        the parameter table (every parameter's Hugging Face and TF name and layout, from
               the family's row `families.Family.conversion`) and the checks every format shares
  hf           Hugging Face PyTorch directories (safetensors, pytorch_model.bin, shards)
  hf_flax      transformers' Flax directories (flax_model.msgpack, shards)
  tf           google-research/bert TF checkpoints (TensorFlow imported only there)
  native       bert_jax's own directory (config.json + Orbax params/)
  checkpointing, run_params   a training run's Orbax checkpoints and the parameters readers take
  detect       which format a path holds, and `load_any` reading any of them
  verify       outputs compared with PyTorch's
  pretrained   the one loader: `load(path | gs:// | Hub id)` -> config, params, head,
               tokenizer, family, whatever the format; `from_pretrained` over it
  hub          a Hugging Face Hub id -> its snapshot directory (the local cache first)
  model_card   the README.md a Hub repository shows
  sentence_transformers   sentence-transformers directories (modules, pooling, Normalize)

`bert_jax.convert` is the command over them and re-exports the functions users call.
"""
