"""Training, shared by every job: what a run is and how it steps. Above `checkpoints`, below the
jobs (`pretrain`, `finetune`, `embed`, `rerank`) and `inference`.

    experiment  the Experiment (model, mesh, rules, optimizer, schedule, shardings), its compiled
                steps, and the experiment config's checks (`check_experiment_config`)
    start       the state a run starts from: its checkpoint, `init_from`, or fresh
    loop        the Trainer, its hooks (metrics, evaluation, checkpoints) and the Timer
    seed_run    one seed of the embed and rerank jobs: train, dev scores at 0 and the end, export
    steps       the pure init/train/eval/predict steps (micro-batches, float16 loss scaling)
    objectives  each head's sums, counts, loss and metrics
    optimizer   optimizers and learning-rate schedules, from the config
    summaries   metrics to metrics.jsonl, TensorBoard, the console and curves.png
    export      the trained parameters as bert_jax and Hugging Face model directories
    flops       model FLOPs per step (heads, backward) on each family's encoder count, for MFU
    run_lock    one run at a time in a run directory
"""
