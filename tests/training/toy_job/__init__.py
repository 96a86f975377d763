"""A job from outside bert_jax, as a user adds one: this folder and its config file."""
