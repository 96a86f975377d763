"""`search`: each query's k best corpus documents by the cosine similarity of a model's
embeddings, found exactly (`retrieval.search`: on the devices, or by faiss on the host), by the
dot product of a SPLADE model's sparse vectors (--index sparse: `retrieval.search.search_sparse`,
sparse matrix products on the host; the model's masked-LM head pooled as `inference embed
--sparse` pools it, each vector's --max_active_dims largest weights kept), or by BM25 over the
texts (--index bm25: `retrieval.lexical`, bm25s's defaults; --model not read); with --qrels,
nDCG@10, MRR@10 and Recall@100 as sentence-transformers' InformationRetrievalEvaluator computes
them (`retrieval.metrics.ranked_scores`).

    python -m bert_jax.inference search --model sentence-transformers/all-MiniLM-L6-v2 \\
        --queries dev.jsonl --corpus corpus.jsonl --qrels dev_qrels.jsonl --output run.jsonl
    python -m bert_jax.inference search --model DIR --queries q.txt --corpus emb/ \\
        --output run.parquet --top_k 100
    python -m bert_jax.inference search --model DIR --queries dev.jsonl --corpus corpus.jsonl \\
        --rerank runs/rerank/hf --rerank_top 20 --qrels dev_qrels.jsonl --output run.jsonl
    python -m bert_jax.inference search --index bm25 --queries dev.jsonl --corpus corpus.jsonl \\
        --qrels dev_qrels.jsonl --output bm25.jsonl --top_k 100
    python -m bert_jax.inference search --index sparse --model runs/splade/hf \\
        --queries dev.jsonl --corpus corpus.jsonl --qrels dev_qrels.jsonl --output splade.jsonl

In:
  --queries   JSONL/CSV/Parquet rows with `text` (or `query`) and an optional `id` (or BEIR's
              `_id`; else the row number from 0), or a text file, one query a line (ids: line
              numbers from 0).
  --corpus    rows with `id` (or `_id`) and `text`, a `title` (BEIR's) put before the text with a
              space as BEIR does, embedded by --model as `inference embed` embeds them
              (--index bm25: indexed by their words);
              or Parquet rows with an id and `embedding` (float32 [E]): the folder (or shards)
              `inference embed --input ... --id_column ID --output FOLDER` writes, whose
              metadata names the id column, or any Parquet with `id` and `embedding`.
  --qrels     JSONL/CSV/Parquet rows naming the relevant documents: `query_id` (or `query-id`)
              and `corpus_id` (or `corpus-id`), or `query` (a query's text) and `id` (a corpus
              id); an optional `score` <= 0 marks a row not relevant. Ids are compared as text.
With --rerank, a cross-encoder (a CrossEncoder directory, a reranker job's export, a Hub id)
scores each query with its first --rerank_top documents and reorders them by that score
(descending; equal scores keep the first stage's order); the documents after them keep their
place, so Recall@100 counts the same documents. The scores written are the cross-encoder's
(--top_k at most --rerank_top: one scale a list), and --corpus must hold the texts.
Out (--output):
  .jsonl      one line per query: {"query_id", "ids": [k corpus ids, best first], "scores"}
  .parquet    the same columns (scores float32)
  with --qrels, OUTPUT's name with `.metrics.json` for its suffix: the scores, counts, settings.

Equal scores rank by ascending corpus id (the evaluator's order; ids of mixed types: corpus
order). Queries without a relevant document are left out of the means, as the evaluator leaves
them; qrels of queries not in --queries are skipped, and qrels naming documents not in --corpus
count as relevant documents never found (as there), each with a warning giving their number.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bert_jax import paths
from bert_jax.data import tables
from bert_jax.inference import batches, encoder, heads, loading
from bert_jax.inference.commands import base
from bert_jax.models.pooling import POOLINGS
from bert_jax.retrieval import lexical, metrics, records
from bert_jax.retrieval import search as search_lib

INDEXES = {"exact": "mesh", "faiss": "faiss"}  # --index -> `retrieval.search.SEARCHES`
LEXICAL = "bm25"  # --index bm25: `retrieval.lexical`, over the corpus's texts, no model
SPARSE = "sparse"  # --index sparse: SPLADE vectors' dot products (`search_lib.search_sparse`)
SPARSE_CHUNK = 1024  # texts embedded, then kept as a sparse matrix, at a time
RECALL_AT = 100  # Recall@100, beside nDCG@10 and MRR@10
OUTPUT_SUFFIXES = (".jsonl", ".parquet")
TEXT_COLUMNS = ("text", "query")
ID_COLUMNS = ("id", "_id")  # BEIR's queries and corpus name the id `_id`
QRELS_LAYOUTS = (("query_id", "corpus_id"), ("query-id", "corpus-id"), ("query", "id"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--model, --queries, --corpus, --output, --top_k, --qrels, --index, the embedding flags."""
    add = parser.add_argument
    add("--model", help="checkpoint or run directory (embeds; not read by --index bm25)")
    add("--queries", required=True, help="JSONL/CSV/Parquet with text (id), or one query a line")
    add("--corpus", required=True, help="rows with id and text, or `inference embed`'s Parquet")
    add("--output", required=True, help="NAME.jsonl or NAME.parquet: each query's top k")
    add("--top_k", type=int, default=10, help="documents written per query")
    add("--qrels", help="relevance rows: nDCG@10, MRR@10, Recall@100 into NAME.metrics.json")
    add(
        "--index",
        choices=(*INDEXES, LEXICAL, SPARSE),
        default="exact",
        help="faiss: on the host's cores; sparse: a SPLADE model's vectors",
    )
    add("--pooling", choices=POOLINGS, default=None, help="as `inference embed`'s")
    add("--normalize", action=argparse.BooleanOptionalAction, default=None, help="as embed's")
    add("--max_seq_length", type=int, default=None, help="tokens kept per text, as embed's")
    add("--truncate_dim", type=int, default=None, help="dimensions kept, as embed's")
    base.add_max_active_dims(parser)
    add("--batch_size", type=int, default=64, help="texts (or pairs) a batch")
    add("--rerank", help="a cross-encoder reordering each query's first --rerank_top documents")
    add("--rerank_top", type=int, default=20, help="documents a query the cross-encoder reorders")
    base.add_dtype(parser)  # the embedder's and the cross-encoder's


class Corpus(NamedTuple):
    """The documents: N ids (as read) and their texts, or their embeddings float32 [N, E] with
    the embed job's settings (None: a corpus of texts)."""

    ids: list
    texts: list[str] | None
    embeddings: np.ndarray | None = None
    settings: dict | None = None


def _found(flag: str, pattern: str) -> list[str]:
    """The files of `pattern`; FileNotFoundError naming the flag."""
    try:
        return tables.expand_inputs(pattern)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{flag}: {e}") from None


def read_queries(path: str) -> tuple[list, list[str]]:
    """(Q ids, Q texts) of --queries (module docstring); ValueError naming the file."""
    path = one_file("--queries", path)
    if not path.lower().endswith(base.TABLE_SUFFIXES):
        texts, second = batches.read_texts(path)
        if second is not None:  # every line held a tab: a query's text, whole
            texts = [f"{a}\t{b}" for a, b in zip(texts, second)]
        return list(range(len(texts))), texts
    found = tables.column_names(path)
    text_column = records.first_column(found, TEXT_COLUMNS)
    if text_column is None:
        raise ValueError(
            f"--queries {path}: no column 'text' (or 'query'); the columns are {found}"
        )
    id_column = records.first_column(found, ID_COLUMNS)
    ids, texts = [], []
    for row, values in tables.iter_rows(path, [c for c in (id_column, text_column) if c]):
        texts.append(records.text(values[text_column], f"{path}: row {row}", text_column))
        ids.append(values[id_column] if id_column else row)
    if not texts:
        raise ValueError(f"--queries {path} holds no query")
    _check_ids(ids, f"--queries {path}")
    return ids, texts


def _check_ids(ids: list, where: str) -> None:
    """ValueError naming a null or repeated id."""
    keys = [str(i) for i in ids]
    if any(i is None for i in ids):
        raise ValueError(f"{where}: row {ids.index(None)} has no id (null)")
    if len(set(keys)) < len(keys):
        seen = set()
        repeated = next(k for k in keys if k in seen or seen.add(k))
        raise ValueError(f"{where}: the id {repeated!r} is given to several rows")


def read_corpus(pattern: str) -> Corpus:
    """--corpus: texts with ids, or the embed job's Parquet (module docstring)."""
    files = _found("--corpus", pattern)
    embedded = [f for f in files if "embedding" in tables.column_names(f)]
    if embedded:
        return _embedded_corpus(files, embedded)
    ids, texts = [], []
    for path in files:
        found = tables.column_names(path)
        id_column = records.first_column(found, ID_COLUMNS) or "id"
        if found and not {id_column, "text"} <= set(found):
            raise ValueError(
                f"--corpus {path}: no column 'id' (or '_id') and 'text' (or 'embedding': the "
                f"Parquet `inference embed` writes); the columns are {found}"
            )
        title = ["title"] if "title" in found else []
        for row, values in tables.iter_rows(path, [id_column, "text", *title]):
            ids.append(values[id_column])
            text = records.text(values["text"], f"{path}: row {row}", "text")
            texts.append(f"{values['title'] or ''} {text}".strip() if title else text)
    if not ids:
        raise ValueError(f"--corpus {pattern} holds no document")
    _check_ids(ids, f"--corpus {pattern}")
    return Corpus(ids, texts)


def _embedding_rows(column: pa.Array, path: str) -> np.ndarray:
    """float32 [N, E] of an `embedding` column of N lists of E floats; ValueError otherwise."""
    floats = pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type)
    floats = floats and pa.types.is_floating(column.type.value_type)
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False) if floats else None
    if not floats or column.null_count or len(set(lengths.tolist())) > 1:
        raise ValueError(
            f"--corpus {path}: `embedding` ({column.type}) is not one float32 [E] a row "
            "(embed without --layers)"
        )
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(column), -1).astype(np.float32)


def _embedded_shard(path: str) -> tuple[list, np.ndarray | None, dict]:
    """(the ids, float32 [n, E] embeddings or None for no rows, the embed job's settings) of
    one Parquet file: its id column is the one the job's metadata names, else `id`."""
    try:
        with paths.as_path(path).open("rb") as f:
            shard = pq.ParquetFile(f)
            meta = json.loads((shard.schema_arrow.metadata or {}).get(b"bert_jax", b"{}"))
            id_column = meta.get("id_column", "id") if meta else "id"
            if id_column not in shard.schema_arrow.names:
                raise ValueError(
                    f"--corpus {path}: no id column ({id_column or 'the embed job ran without'}"
                    " --id_column); embed the corpus with --id_column naming its ids"
                )
            table = shard.read(columns=[id_column, "embedding"])
    except pa.ArrowException as e:
        raise ValueError(f"--corpus {path}: not a readable Parquet file: {e}") from None
    if not table.num_rows:
        return [], None, meta
    rows = _embedding_rows(table.column("embedding").combine_chunks(), path)
    return table.column(id_column).to_pylist(), rows, meta


def _embedded_corpus(files: list[str], embedded: list[str]) -> Corpus:
    """The ids and float32 [N, E] embeddings of the embed job's shards (or any Parquet with
    an id and `embedding`), and the settings the job recorded ({} for other files)."""
    other = [f for f in files if f not in embedded and tables.num_rows(f) != 0]
    if other or not all(f.endswith(".parquet") for f in embedded):
        bad = (other or [f for f in embedded if not f.endswith(".parquet")])[0]
        raise ValueError(f"--corpus: {bad} is not Parquet with an `embedding` column as the rest")
    settings, ids, rows = {}, [], []
    for path in embedded:
        shard_ids, shard_rows, meta = _embedded_shard(path)
        settings = settings or meta
        if shard_rows is not None:
            ids += shard_ids
            rows.append(shard_rows)
    if not ids:
        raise ValueError(f"--corpus {', '.join(files)} holds no document")
    if len({r.shape[1] for r in rows}) > 1:
        widths = sorted({r.shape[1] for r in rows})
        raise ValueError(f"--corpus: shards of embeddings of different widths {widths}")
    _check_ids(ids, f"--corpus {files[0]}{' ...' if len(files) > 1 else ''}")
    return Corpus(ids, None, np.concatenate(rows), settings)


def one_file(flag: str, pattern: str) -> str:
    """The one file `pattern` names; FileNotFoundError or ValueError naming the flag."""
    files = _found(flag, pattern)
    if len(files) > 1:
        raise ValueError(f"{flag} {pattern} names {len(files)} files; give one")
    return files[0]


def read_qrels(path: str) -> list[tuple[str, str, str]]:
    """--qrels: (kind "id" or "text", the query's id or text, the corpus id) of each relevant
    row (a `score` <= 0 is not relevant), ids as text; ValueError naming the file."""
    path = one_file("--qrels", path)
    found = tables.column_names(path)
    layout = next((c for c in QRELS_LAYOUTS if set(c) <= set(found)), None)
    if layout is None:
        names = " or ".join(f"{q!r} and {c!r}" for q, c in QRELS_LAYOUTS)
        raise ValueError(f"--qrels {path}: no columns {names}; the columns are {found}")
    kind = "text" if layout[0] == "query" else "id"
    score = "score" if "score" in found else None
    qrels = []
    for row, values in tables.iter_rows(path, [*layout, *([score] if score else [])]):
        where = f"{path}: row {row}"
        if any(values[c] is None for c in layout):
            raise ValueError(f"{where}: a null {layout[0]!r} or {layout[1]!r}")
        if score is None or records.number(values[score], where, score) > 0:
            qrels.append((kind, str(values[layout[0]]), str(values[layout[1]])))
    if not qrels:
        raise ValueError(f"--qrels {path} holds no relevant row")
    return qrels


def relevant_sets(qrels, query_ids: list, query_texts: list[str], corpus_ids: list | None):
    """Each query's relevant corpus ids (as text; Q sets, empty for a query without one), and
    the warnings: qrels of queries not in --queries (skipped), of documents not in --corpus
    (counted as relevant, never found, as the evaluator counts them; None: no corpus to check).

    Raises:
      ValueError: no query of --queries has a relevant document.
    """
    by_key = {"id": {}, "text": {}}
    for q, (qid, text) in enumerate(zip(query_ids, query_texts)):
        by_key["id"].setdefault(str(qid), []).append(q)
        by_key["text"].setdefault(text, []).append(q)
    known = None if corpus_ids is None else {str(i) for i in corpus_ids}
    relevant = [set() for _ in query_ids]
    unknown_queries, unknown_docs = 0, set()
    for kind, key, doc in qrels:
        rows = by_key[kind].get(key)
        if rows is None:
            unknown_queries += 1
            continue
        for q in rows:
            relevant[q].add(doc)
        if known is not None and doc not in known:
            unknown_docs.add(doc)
    warnings = []
    if unknown_queries:
        warnings.append(f"{unknown_queries} qrels row(s) name a query not in --queries: skipped")
    if unknown_docs:
        warnings.append(
            f"{len(unknown_docs)} relevant document(s) not in --corpus: counted as never found"
        )
    if not any(relevant):
        raise ValueError("--qrels names no query of --queries (by id or by text)")
    return relevant, warnings


def _id_order(ids: list) -> np.ndarray:
    """int [N]: the rows in ascending id (numbers as numbers, texts as texts; mixed: as given)."""
    if all(isinstance(i, int) for i in ids) or all(isinstance(i, str) for i in ids):
        return np.array(sorted(range(len(ids)), key=ids.__getitem__), np.int64)
    return np.arange(len(ids))


def _check(args: argparse.Namespace) -> None:
    """The flags' own mistakes, before any file is read (ValueError naming the flag)."""
    if args.top_k < 1:
        raise ValueError(f"--top_k must be at least 1, got {args.top_k}")
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be at least 1, got {args.batch_size}")
    if args.rerank and args.top_k > args.rerank_top:
        raise ValueError(
            f"--top_k={args.top_k} beyond --rerank_top={args.rerank_top}: the scores written are "
            "the cross-encoder's, which scores the first --rerank_top documents only"
        )
    if not args.output.endswith(OUTPUT_SUFFIXES):
        raise ValueError(f"--output must end in {' or '.join(OUTPUT_SUFFIXES)}: {args.output}")
    if args.model is None and args.index != LEXICAL:
        raise ValueError(f"--model is required: --index {args.index} ranks by its embeddings")
    check_output_apart(args, queries=args.queries, corpus=args.corpus, qrels=args.qrels)
    library = {"faiss": search_lib.faiss_module, LEXICAL: lexical.bm25s_module}.get(args.index)
    try:
        if library is not None:
            library()  # the index's library installed, before any file is read
    except ImportError as e:
        raise ValueError(f"--index {args.index}: {e}") from None


def _embeddings(args, query_texts: list[str], corpus: Corpus) -> tuple[np.ndarray, np.ndarray]:
    """float32 [Q, E] query and [N, E] corpus embeddings of --model (the corpus's as read where
    it holds them), embedded as `inference embed` embeds, each side with the prompt that
    `SentenceTransformer.encode_query` / `encode_document` puts before it (--index sparse:
    SPLADE vectors [Q, V] and [N, V] as sparse matrices, `_sparse_vectors`); warns of
    settings that differ."""
    sparse = args.index == SPARSE
    model = encoder.load_for_embedding(
        args.model,
        pooling="splade" if sparse and args.pooling is None else args.pooling,
        normalize=args.normalize,
        max_seq_length=args.max_seq_length,
        truncate_dim=args.truncate_dim,
        max_active_dims=args.max_active_dims,
    )
    if sparse != (model.options.pooling == "splade"):
        raise ValueError(
            f"--index {args.index} with {model.options.pooling} pooling: a SPLADE model's sparse "
            f"vectors are searched by --index {SPARSE}, dense embeddings by the others"
        )
    queries_model, docs_model = model.for_task("query"), model.for_task("document")
    for warning in model.warnings + _corpus_warnings(args, docs_model, corpus):
        print(f"warning: {warning}", file=sys.stderr)

    def embed(model: encoder.EmbeddingModel, texts: list[str]):
        if sparse:
            return _sparse_vectors(model, texts, args.batch_size, args.dtype)
        return model.embed(texts, batch_size=args.batch_size, dtype=args.dtype)

    docs = corpus.embeddings
    if corpus.texts is not None:
        docs = embed(docs_model, corpus.texts)
    elif sparse:
        docs = search_lib.as_sparse(docs)
    queries = embed(queries_model, query_texts)
    if queries.shape[1] != docs.shape[1]:
        raise ValueError(
            f"--corpus holds embeddings of width {docs.shape[1]}; --model {args.model} embeds "
            f"to {queries.shape[1]}"
        )
    return queries, docs


def _corpus_warnings(args, docs_model: encoder.EmbeddingModel, corpus: Corpus) -> list[str]:
    """Where a corpus of embeddings was embedded with settings other than those this search
    embeds documents with: a line for each."""
    if not corpus.settings:
        return []
    options = docs_model.options
    length = min(options.max_seq_length, docs_model.config.max_sequence_length)
    used = {"model": str(paths.as_path(args.model)), **options._asdict()}
    used["max_seq_length"] = length  # as the embed job records it
    return [
        f"the corpus was embedded with {name}={corpus.settings[name]!r}; this search embeds "
        f"documents with {name}={value!r}"
        for name, value in used.items()
        if name in corpus.settings and corpus.settings[name] != value
    ]


def _sparse_vectors(model: encoder.EmbeddingModel, texts: list[str], batch_size: int, dtype):
    """SPLADE vectors [N, V] of `texts` as one sparse matrix (`search_lib.as_sparse`), embedded
    SPARSE_CHUNK texts at a time (computing in `dtype`), so that the dense [N, V] vectors are
    never held at once."""
    parts = [
        search_lib.as_sparse(
            model.embed(texts[i : i + SPARSE_CHUNK], batch_size=batch_size, dtype=dtype)
        )
        for i in range(0, len(texts), SPARSE_CHUNK)
    ]
    if not isinstance(parts[0], np.ndarray):
        from scipy import sparse

        return sparse.vstack(parts, format="csr")
    return np.concatenate(parts)


def write_results(path: str, query_ids: list, ids: list[list], scores: np.ndarray) -> None:
    """--output: one row per query, {"query_id", "ids", "scores"} (.jsonl or .parquet)."""
    if path.endswith(".parquet"):
        try:
            table = pa.table(
                {
                    "query_id": query_ids,
                    "ids": ids,
                    "scores": pa.array(list(scores), pa.list_(pa.float32())),
                }
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ValueError(f"--output {path}: ids of mixed types ({e}); write .jsonl") from None

        def write(local: str) -> None:
            pq.write_table(table, local)

        paths.write_file_whole(path, write)
        return
    lines = (
        json.dumps({"query_id": q, "ids": i, "scores": [float(x) for x in s]}) + "\n"
        for q, i, s in zip(query_ids, ids, scores)
    )
    paths.write_text_whole(path, "".join(lines))


def metrics_path(output: str) -> str:
    """OUTPUT's name with `.metrics.json` for its suffix (run.jsonl -> run.metrics.json)."""
    return output.rsplit(".", 1)[0] + ".metrics.json"


def check_output_apart(args: argparse.Namespace, **reads: str | None) -> None:
    """Refuses an --output (or, with --qrels, its scores file) that is, or lies in, what the
    command reads (`reads`: {flag name: its pattern, or None}; `tables.check_apart`)."""
    written = [args.output, *([metrics_path(args.output)] if args.qrels else [])]
    tables.check_apart({"--output": written}, {f"--{k}": v for k, v in reads.items()})


def run(args: argparse.Namespace) -> None:
    """Searches --corpus for each of --queries; writes --output (and, with --qrels, the scores)."""
    _check(args)
    query_ids, query_texts = read_queries(args.queries)
    corpus = read_corpus(args.corpus)
    for flag, reads in ((f"--index {LEXICAL}", args.index == LEXICAL), ("--rerank", args.rerank)):
        if reads and corpus.texts is None:
            raise ValueError(
                f"{flag} reads the corpus's texts; --corpus {args.corpus} holds embeddings "
                "only: give the corpus file of texts"
            )
    relevant = None
    if args.qrels is not None:
        relevant, warnings = relevant_sets(
            read_qrels(args.qrels), query_ids, query_texts, corpus.ids
        )
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
    cross_encoder = _cross_encoder(args)
    order = _id_order(corpus.ids)  # equal scores in ascending id, as the evaluator ranks them
    doc_ids = [corpus.ids[i] for i in order]
    doc_texts = None if corpus.texts is None else [corpus.texts[i] for i in order]
    k = min(
        max(args.top_k, args.rerank_top if cross_encoder else 0, RECALL_AT if relevant else 0),
        len(doc_ids),
    )
    if args.index == LEXICAL:
        found = lexical.search_bm25(query_texts, doc_texts, k)
        _warn_of_unmatched(query_texts, found.scores)
    else:
        queries, docs = _embeddings(args, query_texts, corpus)
        if args.index == SPARSE:
            search_fn = search_lib.search_sparse
        else:
            search_fn = search_lib.SEARCHES[INDEXES[args.index]]
        found = search_fn(queries, docs[order], k)
    if cross_encoder is not None:
        found = _reranked(cross_encoder, args, query_texts, doc_texts, found)
    top = min(args.top_k, k)
    ids = [[doc_ids[i] for i in row[:top]] for row in found.indices]
    write_results(args.output, query_ids, ids, found.scores[:, :top])
    print(
        f"wrote the top {top} of {len(doc_ids)} documents for {len(query_ids)} queries to "
        f"{args.output}"
    )
    if relevant is not None:
        ranked = [[str(doc_ids[i]) for i in row] for row in found.indices]
        settings = {"corpus_size": len(doc_ids), "model": args.model, "index": args.index}
        settings["dtype"] = None if args.index == LEXICAL else args.dtype or "float32"
        settings.update(queries=args.queries, corpus=args.corpus, qrels=args.qrels)
        settings.update(rerank=args.rerank, rerank_top=args.rerank_top if args.rerank else None)
        report(args.output, relevant, ranked, settings)


def _warn_of_unmatched(query_texts: list[str], scores: np.ndarray) -> None:
    """Warns of the queries BM25 scores 0 against every document (`scores` [Q, k]: no word of
    theirs is in the index, as every word a document holds scores above 0)."""
    unmatched = np.flatnonzero(scores[:, 0] <= 0) if scores.size else []
    if len(unmatched):
        print(
            f"warning: {len(unmatched)} of {len(query_texts)} queries share no indexed word with "
            f"the corpus (e.g. {query_texts[unmatched[0]]!r}: stopwords only, or words no "
            "document holds); BM25 scores every document 0 for them, so they list it in id order",
            file=sys.stderr,
        )


def _cross_encoder(args) -> loading.CrossEncoder | None:
    """--rerank's cross-encoder (None without it), loaded and checked before any embedding."""
    if not args.rerank:
        return None
    cross_encoder = loading.load_cross_encoder(args.rerank)
    heads.cross_encoder(cross_encoder.config, cross_encoder.head)  # one output
    return cross_encoder


def _reranked(ce, args, query_texts, doc_texts, found: search_lib.Candidates):
    """`found` (indices int [Q, k] into `doc_texts`) with each row's first K = --rerank_top
    reordered by the cross-encoder's scores of (query, document), descending (equal scores in
    the first stage's order), the rest in place; scores float32 [Q, K], the cross-encoder's."""
    num_queries, k = found.indices.shape
    top = min(args.rerank_top, k)
    rows = heads.predict(
        ce.config,
        ce.params,
        ce.head,
        ce.tokenizer,
        [q for q in query_texts for _ in range(top)],
        [doc_texts[i] for row in found.indices for i in row[:top]],
        batch_size=args.batch_size,
        max_seq_length=min(ce.pair_length(None), ce.config.max_sequence_length),
        activation=ce.activation,
        dtype=args.dtype,
    )
    scores = np.array([row["score"] for row in rows], np.float32).reshape(num_queries, top)
    reorder = metrics.top_k(scores, top)  # equal scores keep the first stage's order
    first = np.take_along_axis(found.indices[:, :top], reorder, axis=1)
    return found._replace(
        indices=np.concatenate([first, found.indices[:, top:]], axis=1),
        scores=np.take_along_axis(scores, reorder, axis=1),
    )


def run_scores(relevant: list[set[str]], ranked: list[list[str]]) -> dict:
    """nDCG@10, MRR@10 and Recall@100 (`metrics.ranked_scores`) of the queries with relevant
    documents, and their counts (`ranked`: each query's retrieved ids, as text, best first;
    lists may differ in length)."""
    kept = [q for q, docs in enumerate(relevant) if docs]
    depth = max([len(ranked[q]) for q in kept] + [1])
    hits = np.zeros((len(kept), depth), bool)
    for row, q in enumerate(kept):
        hits[row, : len(ranked[q])] = [d in relevant[q] for d in ranked[q]]
    counts = np.array([len(relevant[q]) for q in kept])
    scores = metrics.ranked_scores(hits, counts, recall_at=(RECALL_AT,))
    return {
        **scores,
        "num_queries": len(kept),
        "num_queries_without_relevant": len(relevant) - len(kept),
    }


def report(output: str, relevant: list[set[str]], ranked: list[list[str]], settings: dict) -> None:
    """Prints and writes (`metrics_path(output)`) `run_scores` and the run's `settings`."""
    scores = run_scores(relevant, ranked)
    record = {**scores, **settings}
    paths.write_text_whole(metrics_path(output), json.dumps(record, indent=2) + "\n")
    print(
        f"nDCG@10 {scores['ndcg@10']:.4f}  MRR@10 {scores['mrr@10']:.4f}  "
        f"Recall@100 {scores[f'recall@{RECALL_AT}']:.4f}  ({scores['num_queries']} queries with "
        f"relevant documents; {metrics_path(output)})"
    )


COMMAND = base.Command(
    "search",
    "each query's top k corpus documents; with --qrels nDCG@10, MRR@10, Recall@100",
    add_arguments,
    run,
)
