"""sentence-transformers directories: an encoder with its pooling and normalization, as
`sentence_transformers.SentenceTransformer(DIR)` loads it.

    save_sentence_transformer(out, config, params, tokenizer_dir=run / "hf", pooling="mean",
                              normalize=True, max_seq_length=128)
    settings = read_sentence_transformer(out)   # .pooling .normalize .max_seq_length, or None
    save_modules(bert_jax_dir, config, settings)  # the modules' files beside other weights

A directory holds the transformers model (config.json, model.safetensors, the tokenizer's files
as the tokenizer of any family writes them, `SubwordTokenizer.save`: its tokenizer_config.json
names its own transformers class and special tokens) and three modules that `modules.json` lists
in order: the `Transformer` (the encoder, in the folder itself; `sentence_bert_config.json` gives
its `max_seq_length`), the `Pooling` (`1_Pooling/config.json`: mean or CLS) and, where the model
normalizes, `Normalize` (`2_Normalize`). A SPLADE model (`pooling="splade"`) is a
`SparseEncoder` directory: the masked-LM model (the family's `Role.MASKED_LM` class, whose
logits it pools) as an `MLMTransformer`, then `SpladePooling` (`1_SpladePooling/config.json`:
max pooling of log(1 + relu(logits))), config_sentence_transformers.json's `model_type`
"SparseEncoder"; `SparseEncoder(DIR)` loads it. An inference-free SparseEncoder (a `Router`,
`router_config.json`: queries to a `SparseStaticEmbedding`, a weight per token, documents to
an MLMTransformer and SpladePooling, each module in its own folder) is read
(`SentenceTransformerSettings.query_module`, `read_static_queries`) and written
(`save_sentence_transformer(..., query_weights=...)`).
`save_modules` writes the modules' files alone, beside weights of another format
(`python -m bert_jax.convert` keeps them in a bert_jax directory).

Written in the format sentence-transformers has saved since version 2 and every later version
(6.x too) reads, as do other readers of the Hub's embedders: module types
`sentence_transformers.models.*` and the `pooling_mode_*_token` flags. Read in that format and in
6.x's (`pooling_mode: "mean"`, module types by their full paths). bert_jax computes mean and CLS
pooling; a directory with another pooling or further modules (Dense, LayerNorm, ...) is an error
naming them, not a model read without them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from safetensors import numpy as safetensors_numpy

from bert_jax import tokenization
from bert_jax.checkpoints import model_card
from bert_jax.checkpoints.hf import read_hf_state_dict, save_pytorch
from bert_jax.models.families import EncoderConfig, Role, family_of
from bert_jax.models.pooling import (
    SENTENCE_POOLINGS,
    SPARSE_POOLINGS,
    check_pooling,
    st_pooling_config,
    st_pooling_modes,
    st_splade_pooling_config,
)
from bert_jax.paths import as_path, prepare_out_dir, write_bytes_whole, write_text_whole

PyTree = Any
MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"  # the model's settings: prompts, kind
POOLING_DIR, NORMALIZE_DIR = "1_Pooling", "2_Normalize"
SPLADE_POOLING_DIR = "1_SpladePooling"
# A SparseEncoder's modules, as every sentence-transformers version since 5 reads them.
SPARSE_MODULES = {
    "MLMTransformer": "sentence_transformers.sparse_encoder.models.MLMTransformer",
    "SpladePooling": "sentence_transformers.sparse_encoder.models.SpladePooling",
}
ROUTER_CONFIG = "router_config.json"  # a Router's routes and their modules' folders
STATIC_EMBEDDING = "SparseStaticEmbedding"  # an inference-free SparseEncoder's query module
STATIC_EMBEDDING_TYPE = "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding"
ROUTER_MODULE = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Router"}
# An inference-free SparseEncoder's routes: each module's folder, "<route>_<index>_<class>".
ROUTES = {
    "query": [f"query_0_{STATIC_EMBEDDING}"],
    "document": [f"document_{i}_{kind}" for i, kind in enumerate(SPARSE_MODULES)],
}
# Names transformer modules' configs had before sentence_bert_config.json.
_LEGACY_TRANSFORMER_CONFIGS = tuple(
    f"sentence_{m}_config.json"
    for m in ("roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
)
# tokenizer_config.json's model_max_length for "no limit" is 1e30; anything this large is none.
_NO_LIMIT = 10**9


@dataclasses.dataclass(frozen=True)
class SentenceTransformerSettings:
    """How a sentence-transformers directory turns the encoder's outputs into embeddings.

    Attributes:
      pooling: "mean" (over the real tokens), "cls" (the first token's hidden state) or
        "splade" (a SparseEncoder's: the masked-LM logits, `models.pooling.splade_pool`).
      normalize: whether the embeddings are scaled to unit L2 norm (a `Normalize` module).
      max_seq_length: tokens kept per text (longer texts are truncated), or None where the
        directory states none.
      transformer_path: the encoder's folder inside the directory ("" for the directory itself,
        as every sentence-transformers version since 2 writes it).
      prompts: texts put before a text to embed, by name (config_sentence_transformers.json's
        `prompts`, e.g. {"query": "search_query: "}); `default_prompt_name`: the one used where
        none is named (None: no prompt).
      query_module: an inference-free SparseEncoder's (a `Router`): the folder of its query
        route's `SparseStaticEmbedding` (`read_static_queries`); None: queries are embedded
        as documents are.
      default_task: the route `encode` takes where no task is given ("query" or "document"; a
        Router's `default_route`), or None: it has none, so a task must be given.
      max_active_dims: a SparseEncoder's vectors keep their largest weights, this many
        (config_sentence_transformers.json's `max_active_dims`); None: all.
    """

    pooling: str
    normalize: bool
    max_seq_length: int | None = None
    transformer_path: str = ""
    prompts: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    default_prompt_name: str | None = None
    query_module: str | None = None
    default_task: str | None = None
    max_active_dims: int | None = None


def save_sentence_transformer(
    directory: str | os.PathLike,
    config: EncoderConfig,
    params: PyTree,
    *,
    tokenizer_dir: str | os.PathLike | tokenization.SubwordTokenizer,
    pooling: str,
    normalize: bool,
    max_seq_length: int,
    prompts: Mapping[str, str] | None = None,
    default_prompt_name: str | None = None,
    card: str | None = None,
    query_weights: np.ndarray | None = None,
) -> str:
    """Writes a sentence-transformers directory of the encoder in `params`.

    `SentenceTransformer(directory).encode(texts)` then equals
    `python -m bert_jax.inference embed --model directory` (same pooling, normalization and
    truncation). Files already there are replaced, each written whole (a temporary name renamed
    over it); a `2_Normalize` folder left by an earlier save is removed from `modules.json` when
    `normalize` is False.

    Args:
      directory: the folder to write (local or a URL); made if absent.
      config: the model's architecture (either family).
      params: the bare encoder's parameters, or a head's that hold them (its pooler, where it
        has one, is saved too); with pooling "splade", the masked-LM model's (its head too).
      tokenizer_dir: a folder holding a tokenizer of the model's family (e.g. a run's `hf/`, a
        converted checkpoint: `tokenization.load_tokenizer`), or the tokenizer itself; saved
        with its own tokenizer_config.json (`model_max_length`: `max_seq_length`).
      pooling: "mean" or "cls"; "splade": a SparseEncoder directory.
      normalize: scale the embeddings to unit length (a `Normalize` module; False for splade).
      max_seq_length: tokens kept per text, the row's special tokens included; at most the
        model's `max_sequence_length` (RoBERTa's 512 of its 514 positions).
      prompts, default_prompt_name: the model's prompts by name and the one used where none is
        named (`SentenceTransformerSettings`); `encode(prompt_name=...)` reads them.
      card: the README.md: its whole text (starting with the Hub's `---` header), or a body
        (how the model was trained, its scores) that follows the embedder's header, usage and
        architecture (`model_card.render_sentence_transformer`); None: no card.
      query_weights: float32 [V] with pooling "splade": an inference-free SparseEncoder, a
        `Router` whose queries are these weights of their tokens (`SparseStaticEmbedding`) and
        whose documents are the masked LM's SPLADE vectors, each module in its own folder.

    Returns:
      `directory` as a string.

    Raises:
      ValueError: an unknown pooling, a max_seq_length outside [2, max_sequence_length], a
        default_prompt_name not among the prompts, or a tokenizer whose vocabulary is not the
        model's.
      FileNotFoundError: no tokenizer in `tokenizer_dir`.
    """
    settings = SentenceTransformerSettings(
        pooling, normalize, max_seq_length, "", dict(prompts or {}), default_prompt_name
    )
    check_settings(config, pooling, max_seq_length)
    check_prompts(settings.prompts, default_prompt_name, "the settings")
    if pooling in SPARSE_POOLINGS and normalize:
        raise ValueError("normalize=True: a SPLADE model's vectors are not normalized")
    tokenizer = _tokenizer(tokenizer_dir, config.vocab_size)
    family = family_of(config)
    if query_weights is not None and pooling not in SPARSE_POOLINGS:
        raise ValueError(f"query_weights with {pooling} pooling: they are a SPLADE model's")
    out = prepare_out_dir(directory, [], overwrite=True)
    if query_weights is not None:
        _save_router(out, config, params, tokenizer, settings, query_weights)
    elif pooling in SPARSE_POOLINGS:  # the whole masked-LM model: its logits are pooled
        save_pytorch(config, params, out, family.head_for(Role.MASKED_LM), overwrite=True)
    else:
        encoder_params = params.get(family.encoder_name, params)
        save_pytorch(config, encoder_params, out, family.base_model, overwrite=True)
    if query_weights is None:
        tokenizer.save(out, model_max_length=max_seq_length)
        _write_module_configs(out, config, settings)
    if card is not None:
        if not card.startswith("---"):  # a body: the embedder's header and usage go first
            card = model_card.render_sentence_transformer(
                config,
                card,
                pooling=pooling,
                normalize=normalize,
                max_seq_length=max_seq_length,
                name=out.parent.name if out.name == "hf" else out.name,  # a run's W/hf: W
                inference_free=query_weights is not None,
            )
        write_text_whole(out / model_card.CARD_NAME, card)
    modules = _modules(settings) if query_weights is None else [ROUTER_MODULE]
    _write_json(out / MODULES_FILE, modules)  # last: a directory from now on
    return os.fspath(out)


def _save_router(out, config, params, tokenizer, settings, query_weights) -> None:
    """An inference-free SparseEncoder's folders (`Router.for_query_document`): the masked LM
    and its SpladePooling for documents, the query weights and their tokenizer for queries
    (truncating at max_seq_length, as the documents' tokenizer does), router_config.json."""
    weight = np.asarray(query_weights, np.float32)
    if weight.shape != (config.vocab_size,):
        raise ValueError(
            f"query_weights of shape {weight.shape}; expected one a vocabulary entry "
            f"({config.vocab_size},)"
        )
    documents, pooling_dir = out / ROUTES["document"][0], out / ROUTES["document"][1]
    masked_lm = family_of(config).head_for(Role.MASKED_LM)
    save_pytorch(config, params, documents, masked_lm, overwrite=True)
    tokenizer.save(documents, model_max_length=settings.max_seq_length)
    _write_module_configs(out, config, settings, documents, pooling_dir)
    queries = out / ROUTES["query"][0]
    tokenizer.save(queries, model_max_length=settings.max_seq_length)
    _write_json(queries / "config.json", {"frozen": False})
    write_bytes_whole(queries / "model.safetensors", safetensors_numpy.save({"weight": weight}))
    names = {STATIC_EMBEDDING: STATIC_EMBEDDING_TYPE, **SPARSE_MODULES}
    types = {m: names[m.split("_", 2)[2]] for folders in ROUTES.values() for m in folders}
    parameters = {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}
    router = {"types": types, "structure": ROUTES, "parameters": parameters}
    _write_json(out / ROUTER_CONFIG, router)


def save_modules(
    directory: str | os.PathLike, config: EncoderConfig, settings: SentenceTransformerSettings
) -> None:
    """Writes the modules' files of a sentence-transformers directory (modules.json, the pooling,
    normalization and max_seq_length) into `directory`, beside weights of another format (a
    bert_jax export): `read_sentence_transformer` (and so the loader) reads them back, and
    `save_sentence_transformer` of the weights restores the directory.

    The encoder is the directory itself, whatever `settings.transformer_path` says (the weights
    beside these files are the encoder's).

    Raises:
      ValueError: as `check_settings`.
    """
    check_settings(config, settings.pooling, settings.max_seq_length)
    check_prompts(settings.prompts, settings.default_prompt_name, "the settings")
    out = as_path(directory)
    _write_module_configs(out, config, settings)
    _write_json(out / MODULES_FILE, _modules(settings))


def _write_module_configs(
    out, config: EncoderConfig, settings: SentenceTransformerSettings, transformer_dir=None,
    splade_pooling_dir=None,
) -> None:  # fmt: skip
    """The Transformer's, Pooling's and Normalize's files (the Transformer's in
    `transformer_dir`, SpladePooling's in `splade_pooling_dir`: a Router's folders; None: the
    usual ones), and the model's settings file."""
    if settings.max_seq_length is not None:
        transformer = {"max_seq_length": settings.max_seq_length, "do_lower_case": False}
        _write_json((transformer_dir or out) / TRANSFORMER_CONFIG, transformer)
    st_config = {
        "prompts": dict(settings.prompts),
        "default_prompt_name": settings.default_prompt_name,
        "similarity_fn_name": "cosine",
    }
    if settings.pooling in SPARSE_POOLINGS:
        pooling_config = st_splade_pooling_config(config.vocab_size)
        pooling_dir = splade_pooling_dir or out / SPLADE_POOLING_DIR
        _write_json(pooling_dir / "config.json", pooling_config)
        st_config.update(model_type="SparseEncoder", similarity_fn_name="dot")
    else:
        pooling_config = st_pooling_config(settings.pooling, config.hidden_size)
        _write_json(out / POOLING_DIR / "config.json", pooling_config)
    if settings.normalize:
        (out / NORMALIZE_DIR).mkdir(parents=True, exist_ok=True)  # the module has no settings
    _write_json(out / ST_CONFIG, st_config)


def _modules(settings: SentenceTransformerSettings) -> list[dict]:
    """modules.json: the Transformer (the directory itself), the Pooling and, where the model
    normalizes, the Normalize module, in order; a SparseEncoder's MLMTransformer and
    SpladePooling."""
    if settings.pooling in SPARSE_POOLINGS:
        modules = [("", SPARSE_MODULES["MLMTransformer"])]
        modules.append((SPLADE_POOLING_DIR, SPARSE_MODULES["SpladePooling"]))
    else:
        modules = [("", "sentence_transformers.models.Transformer")]
        modules.append((POOLING_DIR, "sentence_transformers.models.Pooling"))
    if settings.normalize:
        modules.append((NORMALIZE_DIR, "sentence_transformers.models.Normalize"))
    return [
        {"idx": i, "name": str(i), "path": path, "type": kind}
        for i, (path, kind) in enumerate(modules)
    ]


def check_settings(config: EncoderConfig, pooling: str, max_seq_length: int | None) -> None:
    """Raises ValueError, naming the value, for a pooling bert_jax does not compute or a
    max_seq_length the model cannot take."""
    check_pooling(pooling, SENTENCE_POOLINGS + SPARSE_POOLINGS)
    limit = config.max_sequence_length
    if max_seq_length is not None and not 2 <= max_seq_length <= limit:
        raise ValueError(
            f"max_seq_length={max_seq_length} is outside [2, {limit}] "
            f"(the model's max_sequence_length: the most tokens its positions hold)"
        )


def _tokenizer(source, vocab_size: int) -> tokenization.SubwordTokenizer:
    """The tokenizer `source` is or holds, checked against the model's vocabulary size."""
    if isinstance(source, tokenization.SubwordTokenizer):
        tokenizer = source
    else:
        tokenizer = tokenization.load_tokenizer(source)  # a folder's tokenizer files
    if tokenizer.vocab_size != vocab_size:
        raise ValueError(
            f"the tokenizer ({tokenizer.source}) has {tokenizer.vocab_size} tokens but the "
            f"model's vocab_size is {vocab_size}"
        )
    return tokenizer


def _write_json(path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(value, indent=2) + "\n")


def read_sentence_transformer(
    directory: str | os.PathLike,
) -> SentenceTransformerSettings | None:
    """The pooling, normalization and max_seq_length of a sentence-transformers directory.

    Args:
      directory: a folder (local or a URL); a Hub id must be resolved first (`hub.resolve`).

    Returns:
      Its settings, or None where `directory` is no sentence-transformers embedder: it has no
      modules.json (a plain transformers directory, a checkpoint file), or its modules.json
      lists one Transformer module at its root (a CrossEncoder's: a transformers directory,
      `checkpoints.cross_encoder`).

    Raises:
      ValueError: modules.json or a module's config is not valid JSON of the expected shape, a
        module bert_jax does not compute (Dense, max pooling, ...), or no Pooling module; the
        message names the file and the module.
    """
    folder = as_path(directory)
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        return None
    modules = _read_json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{modules_file} is not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds == ["Transformer"] and not modules[0].get("path"):
        return None  # a CrossEncoder directory: read as the transformers directory it is
    if kinds == list(SPARSE_MODULES):
        return _read_sparse_encoder(folder, modules)
    if kinds == ["Router"]:
        return _read_router(folder, folder / str(modules[0].get("path", "")) / ROUTER_CONFIG)
    supported = ["Transformer", "Pooling", "Normalize"]
    if kinds[:2] != supported[:2] or kinds[2:] not in ([], ["Normalize"]):
        raise ValueError(
            f"{modules_file} lists the modules {kinds}; bert_jax computes "
            f"{supported[:2]} with an optional Normalize, in that order"
        )
    transformer_path = str(modules[0].get("path", ""))
    return SentenceTransformerSettings(
        pooling=_read_pooling(folder / str(modules[1].get("path", "")) / "config.json"),
        normalize=len(kinds) == 3,  # the folder may be absent: the module has no files
        max_seq_length=read_max_seq_length(
            folder / transformer_path if transformer_path else folder
        ),
        transformer_path=transformer_path,
        **read_prompts(folder),
    )


def _read_sparse_encoder(folder, modules: list[dict]) -> SentenceTransformerSettings:
    """A SparseEncoder directory's settings (MLMTransformer, SpladePooling); ValueError naming
    a SpladePooling that is not max pooling of log(1 + relu(logits)), which bert_jax computes."""
    path = folder / str(modules[1].get("path", "")) / "config.json"
    config = _read_json(path) if path.is_file() else {}
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if (strategy, activation) != ("max", "relu"):
        raise ValueError(
            f"{path}: SpladePooling {strategy} with {activation}; bert_jax computes max with relu"
        )
    transformer_path = str(modules[0].get("path", ""))
    length = read_max_seq_length(folder / transformer_path if transformer_path else folder)
    return SentenceTransformerSettings(
        "splade", False, length, transformer_path, **read_prompts(folder, sparse=True)
    )


def _read_router(folder, path) -> SentenceTransformerSettings:
    """An inference-free SparseEncoder's settings: a Router whose "query" route is a
    `SparseStaticEmbedding` and whose "document" route is an MLMTransformer and SpladePooling
    (`Router.for_query_document`); ValueError naming the file for any other routing."""
    if not path.is_file():
        raise ValueError(f"{folder / MODULES_FILE} lists a Router but there is no {path}")
    config = _read_json(path)
    types, structure = config.get("types"), config.get("structure")
    if not isinstance(types, dict) or not isinstance(structure, dict):
        raise ValueError(f"{path} has no types and structure of the Router's modules")
    routes = {
        route: [str(types.get(m, "")).rsplit(".", 1)[-1] for m in ids]
        for route, ids in structure.items()
    }
    want = {"query": [STATIC_EMBEDDING], "document": list(SPARSE_MODULES)}
    parameters = config.get("parameters") or {}
    if routes != want or parameters.get("route_mappings"):
        raise ValueError(
            f"{path} routes {routes} (route_mappings {parameters.get('route_mappings') or {}}); "
            f"bert_jax computes a Router of {want} (an inference-free SparseEncoder)"
        )
    default = parameters.get("default_route")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(structure))  # as the Router takes its first route
    documents = [{"path": m} for m in structure["document"]]
    settings = _read_sparse_encoder(folder, documents)
    query = folder / structure["query"][0]
    return dataclasses.replace(settings, query_module=os.fspath(query), default_task=default)


def read_static_queries(folder) -> tuple[np.ndarray, tokenization.SubwordTokenizer, int | None]:
    """A `SparseStaticEmbedding` module's folder: (its weight float32 [V], one a vocabulary
    entry; its tokenizer; the tokens a query keeps: tokenizer_config.json's model_max_length,
    None for no limit). A query's vector is the weights of the tokens it holds (its tokens
    without the special ones), zero elsewhere.

    Raises:
      ValueError: weights given as an IDF JSON file, no weights, or weights that are not one
        per token of the tokenizer (naming the folder).
    """
    folder = as_path(folder)
    config_file = folder / "config.json"
    config = _read_json(config_file) if config_file.is_file() else {}
    if config.get("path"):
        raise ValueError(
            f"{config_file} takes its weights from {config['path']}; bert_jax reads them from "
            "the module's own model.safetensors (save the module with sentence-transformers)"
        )
    state = read_hf_state_dict(folder)
    weight = np.asarray(state.get("weight", np.zeros(0)), np.float32)
    tokenizer = tokenization.load_tokenizer(folder)
    if weight.shape != (tokenizer.vocab_size,):
        raise ValueError(
            f"{folder}: the query weights have shape {weight.shape}; its tokenizer has "
            f"{tokenizer.vocab_size} tokens"
        )
    return weight, tokenizer, read_max_seq_length(folder)


def read_prompts(folder, sparse: bool = False) -> dict[str, Any]:
    """config_sentence_transformers.json's `prompts` and `default_prompt_name` (none where the
    file is absent), and a SparseEncoder's (`sparse`) `max_active_dims`, as
    `SentenceTransformerSettings` fields; ValueError naming the file for prompts that are not
    texts by name, a default that is not among them, or a max_active_dims not a count."""
    path = folder / ST_CONFIG
    config = _read_json(path) if path.is_file() else {}
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise ValueError(f"{path}: prompts is {prompts!r}; expected texts by name")
    prompts = {name: "" if text is None else text for name, text in prompts.items()}
    default = config.get("default_prompt_name")
    check_prompts(prompts, default, str(path))
    found = {"prompts": prompts, "default_prompt_name": default}
    active = config.get("max_active_dims")
    if sparse and active is not None:
        if isinstance(active, bool) or not isinstance(active, int) or active < 1:
            raise ValueError(f"{path}: max_active_dims is {active!r}; expected a positive integer")
        found["max_active_dims"] = active
    return found


def resolve_prompt(
    settings,
    prompt_name: str | None = None,
    prompt: str | None = None,
    task: str | None = None,
    flag: str = "--prompt_name",
) -> str:
    """The prompt `SentenceTransformer.encode` puts before each text: `prompt` where given, else
    the directory's prompt named `prompt_name`, else (for `task` "query" or "document", as
    `encode_query` / `encode_document` choose) its "query" prompt or its first of "document",
    "passage" and "corpus", else its `default_prompt_name`'s, else none ("").

    Args:
      settings: a `SentenceTransformerSettings` or None (a directory without prompts).
      flag: the option that gave `prompt_name`, named in the error.

    Raises:
      ValueError: `prompt_name` not among the directory's prompts (naming them).
    """
    prompts = dict(settings.prompts) if settings is not None else {}
    if prompt is not None:
        return prompt
    if prompt_name is None and task is not None:
        names = ("query",) if task == "query" else ("document", "passage", "corpus")
        prompt_name = next((n for n in names if n in prompts), None)
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise ValueError(
                f"{flag} {prompt_name!r}: the model's prompts are {sorted(prompts)} "
                "(config_sentence_transformers.json)"
            )
        return prompts[prompt_name]
    default = settings.default_prompt_name if settings is not None else None
    return prompts.get(default, "") if default is not None else ""


def check_prompts(prompts: Mapping[str, str], default_prompt_name: str | None, where: str) -> None:
    """ValueError, naming `where`, for a prompt that is not a text or a default_prompt_name that
    is not one of `prompts`' names."""
    bad = {name: text for name, text in prompts.items() if not isinstance(text, str)}
    if bad:
        raise ValueError(f"{where}: prompts {bad} are not texts")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise ValueError(
            f"{where}: default_prompt_name {default_prompt_name!r} is not one of the prompts "
            f"{sorted(prompts)}"
        )


def _read_json(path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _read_pooling(path) -> str:
    """The pooling mode of a Pooling module's config.json, either format."""
    if not path.is_file():
        raise ValueError(f"the Pooling module has no {path}")
    config = _read_json(path)
    if config.get("include_prompt", True) is False:
        raise ValueError(
            f"{path}: include_prompt false leaves the prompt's tokens out of the pooling; "
            "bert_jax pools every token of the text, its prompt too"
        )
    modes = st_pooling_modes(config)
    if len(modes) != 1 or modes[0] not in SENTENCE_POOLINGS:
        raise ValueError(
            f"{path}: pooling {modes}; bert_jax computes one of {list(SENTENCE_POOLINGS)} pooling"
        )
    return modes[0]


def read_max_seq_length(folder) -> int | None:
    """The Transformer module's max_seq_length: its sentence_bert_config.json (formats 2-5),
    else its tokenizer_config.json's model_max_length (format 6), else None."""
    for name in (TRANSFORMER_CONFIG, *_LEGACY_TRANSFORMER_CONFIGS):
        if (folder / name).is_file():
            config = _read_json(folder / name)
            if config.get("do_lower_case"):
                raise ValueError(
                    f"{folder / name}: do_lower_case lower-cases texts before the tokenizer, "
                    "which bert_jax does not; use an uncased tokenizer instead"
                )
            if config.get("max_seq_length") is not None:
                return int(config["max_seq_length"])
            break
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        length = _read_json(tokenizer_config).get("model_max_length")
        if isinstance(length, (int, float)) and 0 < length < _NO_LIMIT:
            return int(length)
    return None
