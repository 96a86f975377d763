"""Training, shared by every job: what a run is and how it steps. Above `checkpoints`, below the
jobs (`pretrain`, `finetune`, `embed`, `rerank`) and `inference`; the modules:
docs/architecture.md.
"""
