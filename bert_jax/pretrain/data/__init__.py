"""BERT pretraining data: example creation, record files and the grain pipeline.

Modules (each a leaf: none imports the model or the training code):

    sentences                split_sentences: offline sentence splitting
    sources                  documents from text files, tfds, and the Shakespeare default corpus
    examples                 examples with google-research/bert's recipe (NSP pairs, static masks)
    masking                  vectorized dynamic masking of batches (new masks every epoch)
    example_proto            tf.train.Example wire format without TensorFlow
    records                  TFRecord and ArrayRecord files and grain data sources over them
    features                 the record layout and the batch the training step consumes
    corpus                   tokenized documents stored as flat arrays
    build                    parallel, resumable shard building
    build_dir                a build's directory: build.json, metadata.json, checks, resuming
    pipeline                 make_pretraining_loader: the deterministic, checkpointable grain loader
    create_pretraining_data  the `bert-jax-create-pretraining-data` command
    train_wordpiece          the `bert-jax-train-wordpiece` command

Nothing is imported here, so importing one module does not pull in grain. Tokenization is
`bert_jax.tokenization` (shared with fine-tuning and inference).
"""
