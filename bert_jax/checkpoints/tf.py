"""TF checkpoints: google-research/bert's (`bert_model.ckpt.*` or `model.ckpt-N.*` beside
`bert_config.json`) and google-research/electra's (both models of a pretraining run in one
checkpoint), read with TensorFlow (an optional extra, imported only here).

A checkpoint is read with the config file of the model it holds: `config_path`, else the file a
family with TF checkpoints names (`FamilyConversion.tf_config_file`) beside the checkpoint, the
first found in the registry's order; the config's family (its `model_type`: a bert_config.json
has none and is BERT's) names the parameters. bert_config.json's "gelu" is the erf GELU unless
told otherwise (`TF_GELU_NOTE`). google-research/electra's checkpoints come without a config
file: they take the Hugging Face `config.json` of the model read (google/electra-base-
discriminator's, or `ElectraConfig.preset("base").to_json_file(...)`), beside the checkpoint or
given; ElectraForPreTraining (the discriminator) by default, ElectraForMaskedLM (the generator,
`generator/...` reading the discriminator's embeddings) with the generator's config:

    config, params = load_tf("electra_base/", config_path="discriminator/config.json")
    config, params = load_tf("electra_base/", "ElectraForMaskedLM",
                             config_path="generator/config.json")
    python -m bert_jax.convert electra_base/ out/ --to hf --model ElectraForMaskedLM \\
        --config generator/config.json

Paths go through `etils.epath`: a checkpoint at a URL (gs://...) is found there and its files
copied to a local temporary folder for TensorFlow's reader.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
from etils import epath

from bert_jax.checkpoints.table import (
    ConversionError,
    ConversionReport,
    ParamRule,
    assemble_params,
    check_config_fits,
    parameter_table,
)
from bert_jax.models.families import (
    FAMILIES,
    EncoderConfig,
    Family,
    Role,
    config_from_json_file,
    family_of,
)
from bert_jax.paths import as_path, is_url

TF_DATA_RE = re.compile(r"\.data-\d{5}-of-\d{5}$")
_TF_STEP_RE = re.compile(r"-(\d+)$")
_TF_SKIP_RE = re.compile(r"(^global_step$|/adam_[mv]$|^bad_steps$|^good_steps$|^loss_scale$)")

TF_GELU_NOTE = (
    "bert_config.json's hidden_act 'gelu' is the exact (erf) GELU in google-research/bert's first "
    "release (2018) and in transformers, but its tanh approximation in google-research/bert's code "
    "since February 2019 (outputs differ by up to about 1e-2); erf is assumed. A checkpoint "
    "trained with the later code: pass hidden_act='gelu_new' (--hidden-act gelu_new)"
)


def tf_families() -> list[Family]:
    """The families with TF checkpoints (a `FamilyConversion.tf_config_file`), in the registry's
    order (BERT's first)."""
    return [f for f in FAMILIES.values() if f.conversion and f.conversion.tf_config_file]


def tf_family() -> Family:
    """The family whose checkpoints google-research/bert's TF code writes: the first with TF
    checkpoints."""
    return tf_families()[0]


def is_tf_path(path: str | os.PathLike) -> bool:
    """Whether `path` (not a folder) is a TF checkpoint's prefix or one of its files."""
    path = as_path(path)
    text = os.fspath(path)
    if epath.Path(text + ".index").exists():
        return True
    return path.is_file() and (text.endswith(".index") or bool(TF_DATA_RE.search(text)))


def _tf_prefixes(folder: epath.Path) -> list[str]:
    """The checkpoint prefixes in `folder`: names with an `.index` file, newest step last."""
    names = [p.name[: -len(".index")] for p in folder.iterdir() if p.name.endswith(".index")]
    names = [n for n in names if n and not n.startswith(".")]

    def step(name: str) -> tuple[int, str]:
        m = _TF_STEP_RE.search(name)
        return (int(m.group(1)) if m else -1, name)

    return sorted(names, key=step)


def _same_folder(a: str, b: epath.Path) -> bool:
    if is_url(b):
        return os.fspath(as_path(a)) == os.fspath(b)
    return os.path.realpath(a) == os.path.realpath(b)


def _tf_state_file_choice(folder: epath.Path) -> tuple[str | None, str | None]:
    """(the prefix, in `folder`, that TF's `checkpoint` file there names, or None; the name as
    written). A path to another folder (or one written on the machine that trained) gives None."""
    state = folder / "checkpoint"
    if not state.is_file():
        return None, None
    text = state.read_bytes().decode("utf-8", errors="replace")
    m = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', text, re.MULTILINE)
    if not m:
        return None, None
    name = m.group(1)
    where = os.path.dirname(name if os.path.isabs(name) else os.path.join(folder, name))
    local = folder / os.path.basename(name)
    if _same_folder(where, folder) and epath.Path(os.fspath(local) + ".index").exists():
        return os.fspath(local), name
    return None, name


def find_tf_checkpoint(path: str | os.PathLike) -> tuple[str, str | None]:
    """The TF checkpoint prefix `path` stands for, and a note on the choice when there was one.

    `path` is a prefix (`.../bert_model.ckpt`, `.../model.ckpt-1000`), one of its files
    (`.index`, `.data-00000-of-00001`) or a folder. In a folder, TF's `checkpoint` file is
    followed when it names a checkpoint in that folder; otherwise (no such file, or an absolute
    path from the machine that trained) the newest step among the folder's `*.index` files is
    taken (`model.ckpt-1000` as run_pretraining.py and run_classifier.py write them).

    Raises:
      FileNotFoundError: no checkpoint there (naming what was looked for).
    """
    path = as_path(path)
    if not path.is_dir():
        prefix = re.sub(r"\.index$", "", TF_DATA_RE.sub("", os.fspath(path)))
        if not epath.Path(prefix + ".index").exists():
            raise FileNotFoundError(f"TF checkpoint not found: {prefix}.index")
        return prefix, None
    prefixes = _tf_prefixes(path)
    if not prefixes:
        raise FileNotFoundError(
            f"no TF checkpoint in {path}: no *.index file (e.g. bert_model.ckpt.index, "
            "model.ckpt-1000.index)"
        )
    named, written = _tf_state_file_choice(path)
    if named:
        return named, None if len(prefixes) == 1 else (
            f"read {os.path.basename(named)} (named by {path}/checkpoint) of {len(prefixes)} "
            "checkpoints in the folder"
        )
    return _newest(path, prefixes, written)


def _newest(path: epath.Path, prefixes: list[str], written: str | None) -> tuple[str, str | None]:
    """The newest step of a folder's checkpoints, and the note saying so."""
    ignored = f" ({path}/checkpoint names {written}, not in this folder)" if written else ""
    chosen = os.fspath(path / prefixes[-1])
    if len(prefixes) == 1:
        return chosen, f"read {prefixes[-1]}{ignored}" if ignored else None
    if not _TF_STEP_RE.search(prefixes[-1]):
        raise FileNotFoundError(
            f"{path} holds several TF checkpoints {prefixes} without step numbers{ignored}; "
            "pass the prefix of one"
        )
    return chosen, (
        f"read {prefixes[-1]}, the newest step of {len(prefixes)} checkpoints in {path} "
        f"({', '.join(prefixes)}){ignored}; pass another's prefix to read it"
    )


def _tf_config_path(ckpt: str, model: Role | str | None, config_path) -> str | os.PathLike:
    """`config_path`, else the config file beside the checkpoint prefix `ckpt`: the first
    family's `tf_config_file` found there, `model`'s family first when it is a class name (a
    class of another family is then refused by `_tf_head`), then the registry's order.

    Raises:
      FileNotFoundError: none there, naming what was looked for and what to pass.
    """
    if config_path:
        return config_path
    folder = as_path(ckpt).parent
    families = sorted(tf_families(), key=lambda f: model not in f.model_classes)  # stable
    for family in families:
        if (folder / family.conversion.tf_config_file).exists():
            return os.fspath(folder / family.conversion.tf_config_file)
    wanted = " or ".join(
        f"{f.conversion.tf_config_file} ({f.config_class.display_name})" for f in families
    )
    raise FileNotFoundError(
        f"no config file beside the TF checkpoint {ckpt}: looked for {wanted} in {folder}. Put "
        "the model's there or pass config_path (--config); a checkpoint released without one "
        "(google-research/electra's) takes the Hugging Face config.json of the model read"
    )


def _gelu_is_ambiguous(family: Family) -> bool:
    """Whether the family's TF config file is google-research/bert's own bert_config.json, whose
    "gelu" is ambiguous (`TF_GELU_NOTE`); a Hugging Face config.json (ELECTRA's) names the
    activation as transformers computes it (google-research/electra's "gelu" is erf too)."""
    return family.conversion.tf_config_file != "config.json"


def _tf_config(config_path: str | os.PathLike, hidden_act: str | None, report) -> EncoderConfig:
    """The config file of a family with TF checkpoints, with `hidden_act` (if given) in place of
    its activation; the choice made for an ambiguous "gelu" goes to the report's notes, which
    the caller logs or prints once."""
    config = config_from_json_file(config_path)
    family = family_of(config)
    if family not in tf_families():
        raise ValueError(
            f"{config_path} is a {family.config_class.display_name} config; TF checkpoints hold "
            f"{' or '.join(f.config_class.display_name for f in tf_families())} models"
        )
    if hidden_act is not None:
        if hidden_act != config.hidden_act:
            report.notes.append(
                f"hidden_act={hidden_act!r} (given) in place of {config_path}'s "
                f"{config.hidden_act!r}"
            )
        return config.replace(hidden_act=hidden_act)
    if config.hidden_act == "gelu" and _gelu_is_ambiguous(family):
        report.notes.append(TF_GELU_NOTE)  # logged with the report (`ConversionReport.log`)
    return config


def _open_reader(ckpt: str, scratch: str):
    """TensorFlow's reader of the checkpoint `ckpt` (a prefix); a URL's files are copied into
    the local folder `scratch` first, so that they are read through epath as every other format."""
    import tensorflow as tf

    if is_url(ckpt):
        prefix = as_path(ckpt)
        for f in prefix.parent.glob(prefix.name + ".*"):
            f.copy(epath.Path(scratch) / f.name)
        ckpt = os.path.join(scratch, prefix.name)
    try:
        return tf.train.load_checkpoint(ckpt)
    except Exception as e:  # noqa: BLE001 - TF raises its own error types
        raise ConversionError(f"cannot read TF checkpoint {ckpt}: {e}") from e


def _with_num_labels(config, model: str, names) -> EncoderConfig:
    """The config has no label count: a head whose TF weights include the family's
    `tf_num_labels_key` (run_classifier.py's output_weights, [N, E]) takes it from there."""
    key = family_of(config).conversion.tf_num_labels_key
    rules = parameter_table(config, model) if key and key in names else []
    # A classifier as wide as the label count (a multiple-choice head's is 1 wide).
    if any(r.tf_key == key and r.shape[-1] == config.num_labels for r in rules):
        return config.replace(num_labels=int(names[key][0]))
    return config


def _tf_lookup(reader, names):
    """The `assemble_params` lookup of a TF checkpoint's reader: a rule's TF name."""

    def lookup(rule: ParamRule, used):
        if rule.tf_key not in names:
            return None
        w = reader.get_tensor(rule.tf_key)
        return rule.tf_key, (w if w.size != rule.source_size else rule.from_tf(w))

    return lookup


def _own_layers(config: EncoderConfig, model: str, names):
    """The checkpoint's {name: shape} but the layers of another model it holds (ELECTRA's
    discriminator beside its generator): those whose scope is not `model`'s layers' scope, so
    that the layer count is checked against `model`'s own."""
    family = family_of(config)
    conv, layer = family.conversion, family.layer_name.format(0)
    scope = conv.tf_key("/".join((family.encoder_name, *family.layers_path, layer, "")), model)
    scope = scope[: scope.index(layer)]  # "bert/encoder/", "generator/encoder/"
    return {k: v for k, v in names.items() if not conv.layer_index.search(k) or k.startswith(scope)}


def _tf_head(family: Family, model: Role | str | None) -> str:
    """The family's class of `model` (a role, or a class name of the family; another family's
    is refused), or the head its TF checkpoints are read as by default."""
    return family.head_for(model or family.conversion.tf_default_head)


def tf_head(
    ckpt: str | os.PathLike,
    model: Role | str | None = None,
    *,
    config_path: str | os.PathLike | None = None,
) -> str:
    """The head class `load_tf` reads the TF checkpoint `ckpt` as: `model` (a role, or a class
    name of the family) in the family of the checkpoint's config file, else that family's
    `tf_default_head` (BertForPreTraining, ElectraForPreTraining)."""
    prefix, _ = find_tf_checkpoint(ckpt)
    config = config_from_json_file(_tf_config_path(prefix, model, config_path))
    return _tf_head(family_of(config), model)


def load_tf(
    ckpt: str | os.PathLike,
    model: Role | str | None = None,
    *,
    config_path: str | os.PathLike | None = None,
    hidden_act: str | None = None,
    allow_new_heads: bool = False,
    scan_layers: bool = False,
    dtype=np.float32,
    seed: int = 0,
    return_report: bool = False,
):
    """Loads a TF checkpoint of google-research/bert or google-research/electra.

    Needs TensorFlow (`pip install bert-jax[tf]`). Optimizer slots (adam_m/adam_v) and
    global_step are ignored and counted in the report.

    Args:
      ckpt: a prefix (`.../bert_model.ckpt`, `.../model.ckpt-1000`), its `.index` or `.data-*`
        file, or a folder (`find_tf_checkpoint`: its newest step unless TF's `checkpoint` file
        names one in it; the report's notes say which); local or a URL.
      model: the head class, or a role (default: the family's `tf_default_head`,
        BertForPreTraining, ElectraForPreTraining); a class name of another family is refused
        (ValueError, naming the checkpoint's family's class for its role).
      config_path: the config file (default: beside the checkpoint: `_tf_config_path`,
        bert_config.json or an ELECTRA config.json); its family names the weights.
      hidden_act: the activation, overriding the config's. bert_config.json's "gelu" is ambiguous
        (`TF_GELU_NOTE`): erf is assumed and the report says so; "gelu_new" picks the tanh form
        of google-research/bert's code since February 2019.
      Others as `hf.load_pytorch`.
    """
    try:
        import tensorflow  # noqa: F401 - refused early, before any file is read
    except ImportError as e:
        raise ImportError(
            "reading TF checkpoints needs TensorFlow: pip install 'bert-jax[tf]'"
        ) from e
    ckpt, chosen = find_tf_checkpoint(ckpt)
    report = ConversionReport(notes=[chosen] if chosen else [])
    config_path = _tf_config_path(ckpt, model, config_path)
    config = _tf_config(config_path, hidden_act, report)
    model = _tf_head(family_of(config), model)
    with tempfile.TemporaryDirectory(prefix="bert_jax_tf_") as scratch:
        reader = _open_reader(ckpt, scratch)
        names = reader.get_variable_to_shape_map()
        check_config_fits(config, _own_layers(config, model, names), config_path, ckpt)
        config = _with_num_labels(config, model, names)
        keys = [n for n in sorted(names) if not _TF_SKIP_RE.search(n)]
        report.ignored.extend(n for n in sorted(names) if _TF_SKIP_RE.search(n))
        params = assemble_params(
            config, model, _tf_lookup(reader, names), keys, allow_new_heads=allow_new_heads,
            scan_layers=scan_layers, dtype=dtype, seed=seed, report=report,
        )  # fmt: skip
    if not return_report:  # a caller asking for the report logs it (once)
        report.log(f"loaded {model} from {ckpt}")
    return (config, params, report) if return_report else (config, params)
